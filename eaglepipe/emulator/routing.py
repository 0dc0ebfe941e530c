"""OpenRouter's provider routing, applied to the emulator's endpoint table.

The client's routing policy (quantizations, allowlists, no fallbacks) is what keeps the real run on
unquantized providers, so the emulator enforces the same filters and fails the same way (404) when
nothing is left, instead of quietly serving anyway. `data_collection`, `zdr`, `enforce_distillable_text`
and the `preferred_*` fields are accepted but filter nothing: the table has no data policies or live
latency to judge them by.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

from eaglepipe.emulator.errors import ApiError
from eaglepipe.emulator.providers import Endpoint

ROUTING_FIELDS = {
    "allow_fallbacks",
    "data_collection",
    "enforce_distillable_text",
    "ignore",
    "max_price",
    "only",
    "order",
    "preferred_max_latency",
    "preferred_min_throughput",
    "quantizations",
    "require_parameters",
    "sort",
    "zdr",
}
QUANTIZATION_FAMILIES = {"fp4": {"fp4", "mxfp4", "nvfp4"}, "fp8": {"fp8", "mxfp8"}}
_SORTS = {"price", "throughput", "latency"}


def _bad(message: str) -> ApiError:
    return ApiError(400, message, "invalid_request")


def _slugs(provider: dict[str, Any], key: str) -> list[str]:
    value = provider.get(key, [])
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise _bad(f"provider.{key} must be a list of provider slugs (strings)")
    return [v.lower() for v in value]


def _flag(provider: dict[str, Any], key: str, default: bool) -> bool:
    value = provider.get(key, default)
    if not isinstance(value, bool):
        raise _bad(f"provider.{key} must be true or false")
    return value


def slug_matches(slug: str, tag: str) -> bool:
    """A base slug (`chutes`) matches all of that provider's endpoints, `chutes/int4` only that one."""
    tag = tag.lower()
    return tag == slug or ("/" not in slug and tag.startswith(slug + "/"))


def _quantization_allowed(endpoint: Endpoint, wanted: list[str]) -> bool:
    quantization = endpoint.public["quantization"]
    return quantization is not None and any(
        quantization == q or quantization in QUANTIZATION_FAMILIES.get(q, ()) for q in wanted
    )


def _over_max_price(endpoint: Endpoint, max_price: dict[str, float]) -> bool:
    return any(endpoint.price(kind) * 1_000_000 > limit for kind, limit in max_price.items())


def _sort_key(sort: str):
    if sort == "throughput":
        return lambda e: -((e.public.get("throughput_last_30m") or {}).get("p50") or 0.0)
    if sort == "latency":
        return lambda e: (e.public.get("latency_last_30m") or {}).get("p50") or float("inf")
    return lambda e: e.price("prompt") + e.price("completion")


def _validated_max_price(provider: dict[str, Any]) -> dict[str, float]:
    max_price = provider.get("max_price", {})
    if not isinstance(max_price, dict) or not all(
        k in {"prompt", "completion", "request"} and isinstance(v, int | float) and not isinstance(v, bool)
        for k, v in max_price.items()
    ):
        raise _bad("provider.max_price must map prompt/completion/request to USD per million tokens")
    return max_price


def _validated_sort(provider: dict[str, Any]) -> str:
    sort = provider.get("sort", "price")
    if isinstance(sort, dict):
        sort = sort.get("by", "price")
    if sort not in _SORTS:
        raise _bad(f"provider.sort must be one of {sorted(_SORTS)}")
    return sort


def route(
    endpoints: Sequence[Endpoint],
    provider: dict[str, Any] | None,
    *,
    requested_parameters: set[str],
    max_tokens: int | None,
) -> Endpoint:
    """The endpoint OpenRouter would serve this request from, or the 400/404 it would answer."""
    provider = {} if provider is None else provider
    if not isinstance(provider, dict):
        raise _bad("provider must be an object of routing preferences")
    unknown = sorted(set(provider) - ROUTING_FIELDS)
    if unknown:
        raise _bad(
            f"provider.{unknown[0]} is not a routing field (allowed: {', '.join(sorted(ROUTING_FIELDS))})"
        )
    only, ignore, order = _slugs(provider, "only"), _slugs(provider, "ignore"), _slugs(provider, "order")
    quantizations = _slugs(provider, "quantizations")
    allow_fallbacks = _flag(provider, "allow_fallbacks", True)
    require_parameters = _flag(provider, "require_parameters", False)
    max_price, sort = _validated_max_price(provider), _validated_sort(provider)

    removed: Counter[str] = Counter()
    candidates = []
    for endpoint in endpoints:
        reason = None
        if endpoint.status < 0:
            reason = "down"
        elif only and not any(slug_matches(s, endpoint.tag) for s in only):
            reason = "not in only"
        elif any(slug_matches(s, endpoint.tag) for s in ignore):
            reason = "ignored"
        elif quantizations and not _quantization_allowed(endpoint, quantizations):
            reason = "quantization"
        elif require_parameters and not all(endpoint.supports(p) for p in requested_parameters):
            reason = "missing parameters"
        elif max_price and _over_max_price(endpoint, max_price):
            reason = "over max_price"
        elif max_tokens is not None and max_tokens > (endpoint.public["max_completion_tokens"] or max_tokens):
            reason = "max_tokens above max_completion_tokens"
        elif order and not allow_fallbacks and not any(slug_matches(s, endpoint.tag) for s in order):
            reason = "not in order (allow_fallbacks false)"
        if reason:
            removed[reason] += 1
        else:
            candidates.append(endpoint)
    if not candidates:
        summary = ", ".join(f"{n} {why}" for why, n in removed.items())
        raise ApiError(
            404,
            f"No allowed providers are available for the selected model ({summary})",
            "not_found",
            reason="constraint_filtered",
            removed=dict(removed),
        )
    candidates.sort(key=_sort_key(sort))
    for slug in order:
        for endpoint in candidates:
            if slug_matches(slug, endpoint.tag):
                return endpoint
    return candidates[0]
