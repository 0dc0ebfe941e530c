"""Which provider endpoints may serve the target model, decided from the live endpoint list.

The policy is applied here, on our side, so every drop has a reason we can show; the request then pins
the survivors (`only` + `allow_fallbacks: false`) so OpenRouter cannot route anywhere else.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, TypedDict

from eaglepipe.chat_api import Endpoint, ProviderPreferences
from eaglepipe.openrouter.errors import OpenRouterError, error_detail
from eaglepipe.openrouter.secrets import ApiKey

# A family name in the policy admits its variants, as OpenRouter's own `quantizations` filter does.
QUANTIZATION_FAMILIES = {"fp4": {"fp4", "mxfp4", "nvfp4"}, "fp8": {"fp8", "mxfp8"}}
UNKNOWN_QUANTIZATION = "unknown"
FETCH_TIMEOUT_S = 30.0


class PolicyRecord(TypedDict):
    """A RoutingPolicy as providers.json keeps it."""

    quantizations: list[str]
    ignore: list[str]
    only: list[str] | None
    min_uptime: float | None
    require_parameters: list[str]
    max_tokens: int | None


class DroppedEndpoint(TypedDict):
    endpoint: Endpoint
    reason: str


class ProvidersFile(TypedDict):
    """providers.json: the endpoints the API listed for the model, split by the routing policy."""

    model: str
    fetched_at: str
    source: str
    policy: PolicyRecord
    kept: list[Endpoint]
    dropped: list[DroppedEndpoint]


@dataclass(frozen=True)
class RoutingPolicy:
    """An empty `quantizations` means no quantization filter; `only=None` means no allowlist."""

    quantizations: tuple[str, ...] = ()
    ignore: tuple[str, ...] = ()
    only: tuple[str, ...] | None = None
    min_uptime: float | None = None
    require_parameters: tuple[str, ...] = ()
    max_tokens: int | None = None

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> RoutingPolicy:
        """Unknown keys are rejected: a misspelt filter would otherwise silently route anywhere."""
        unknown = sorted(set(config) - set(cls.__dataclass_fields__))
        if unknown:
            allowed = ", ".join(cls.__dataclass_fields__)
            raise OpenRouterError(f"routing config: unknown key {unknown[0]!r}; allowed keys are {allowed}")
        only = config.get("only")
        return cls(
            quantizations=tuple(q.lower() for q in _names(config, "quantizations")),
            ignore=_names(config, "ignore"),
            only=None if only is None else _names(config, "only"),
            min_uptime=_number(config, "min_uptime"),
            require_parameters=_names(config, "require_parameters"),
            max_tokens=_integer(config, "max_tokens"),
        )

    def as_dict(self) -> PolicyRecord:
        """JSON-able, for providers.json: the decision is reviewable next to its inputs."""
        return {
            "quantizations": list(self.quantizations),
            "ignore": list(self.ignore),
            "only": None if self.only is None else list(self.only),
            "min_uptime": self.min_uptime,
            "require_parameters": list(self.require_parameters),
            "max_tokens": self.max_tokens,
        }


def select_endpoints(
    endpoints: list[Endpoint], policy: RoutingPolicy
) -> tuple[list[Endpoint], list[DroppedEndpoint]]:
    """(kept endpoints, dropped as `{"endpoint", "reason"}`), each in the API's order."""
    kept: list[Endpoint] = []
    dropped: list[DroppedEndpoint] = []
    for endpoint in endpoints:
        reasons = _rejections(endpoint, policy)
        if reasons:
            dropped.append({"endpoint": endpoint, "reason": "; ".join(reasons)})
        else:
            kept.append(endpoint)
    return kept, dropped


def dearest_price(endpoints: list[Endpoint], side: Literal["prompt", "completion"]) -> float:
    """USD per token of the dearest endpoint on one side ("prompt" or "completion"): an upper bound for
    budgets and plans, whichever kept endpoint ends up serving."""
    return max((float((e.get("pricing") or {}).get(side) or 0) for e in endpoints), default=0.0)


def provider_request(kept: list[Endpoint], policy: RoutingPolicy) -> ProviderPreferences:
    """The request's `provider` object. Tags are sorted so a reordered endpoint list does not change
    the request fingerprint (and thereby discard paid responses)."""
    provider: ProviderPreferences = {"only": sorted({endpoint["tag"] for endpoint in kept})}
    if policy.quantizations:
        provider["quantizations"] = list(policy.quantizations)
    provider["allow_fallbacks"] = False
    provider["require_parameters"] = True
    return provider


def fetch_providers(
    base_url: str, model: str, api_key: ApiKey | None, policy: RoutingPolicy
) -> ProvidersFile:
    """The content of providers.json: the live endpoint list split by the policy."""
    import httpx  # here, not at the top: the spend plan imports this module while Snakemake parses
    url = f"{base_url.rstrip('/')}/models/{model}/endpoints"
    headers = api_key.authorization_header() if api_key else {}
    try:
        response = httpx.get(url, headers=headers, timeout=FETCH_TIMEOUT_S)
    except httpx.HTTPError as error:
        raise OpenRouterError(
            f"GET {url} failed ({type(error).__name__}): check base_url and the network"
        ) from None
    if response.status_code != 200:
        raise OpenRouterError(
            f"GET {url}: HTTP {response.status_code} {error_detail(response)}: "
            "check the model id and base_url"
        )
    try:
        # Taken as the API describes them; the policy reads every field it judges defensively.
        endpoints: list[Endpoint] = response.json()["data"]["endpoints"]
    except (ValueError, KeyError, TypeError):
        raise OpenRouterError(
            f"GET {url}: the answer has no data.endpoints list: is base_url an OpenRouter API?"
        ) from None
    kept, dropped = select_endpoints(endpoints, policy)
    if not kept:
        reasons = "; ".join(f"{item['endpoint'].get('tag')}: {item['reason']}" for item in dropped)
        raise OpenRouterError(
            f"no endpoint of {model} passes the routing policy "
            f"({reasons or 'the API listed none'}): relax `routing` in the config"
        )
    return {
        "model": model,
        "fetched_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "source": base_url,
        "policy": policy.as_dict(),
        "kept": kept,
        "dropped": dropped,
    }


def _rejections(endpoint: Endpoint, policy: RoutingPolicy) -> list[str]:
    reasons = []
    if policy.only is not None and not _matches_any(endpoint, policy.only):
        reasons.append("not in `only`")
    if _matches_any(endpoint, policy.ignore):
        reasons.append("in `ignore`")
    status = endpoint.get("status")
    if status is not None and status < 0:
        reasons.append(f"status {status} (degraded or down)")
    quantization = (endpoint.get("quantization") or UNKNOWN_QUANTIZATION).lower()
    if policy.quantizations and quantization not in _admitted_quantizations(policy.quantizations):
        reasons.append(f"quantization {quantization} not in {list(policy.quantizations)}")
    uptime = _uptime(endpoint)
    if policy.min_uptime is not None and uptime is not None and uptime < policy.min_uptime:
        reasons.append(f"uptime {uptime:g}% < {policy.min_uptime:g}%")
    supported = set(endpoint.get("supported_parameters") or ())
    missing = [name for name in policy.require_parameters if name not in supported]
    if missing:
        reasons.append(f"does not support {', '.join(missing)}")
    limit = endpoint.get("max_completion_tokens")
    if policy.max_tokens is not None and limit is not None and limit < policy.max_tokens:
        reasons.append(f"max_completion_tokens {limit} < {policy.max_tokens}")
    return reasons


def _matches_any(endpoint: Endpoint, names: tuple[str, ...]) -> bool:
    """A base slug names all of a provider's endpoints, `x/variant` only that one (OpenRouter's rule);
    the display name is accepted too, case-insensitively, because that is what users read."""
    tag = str(endpoint.get("tag") or "").lower()
    identities = {tag, tag.split("/", 1)[0], str(endpoint.get("provider_name") or "").lower()}
    return any(name.lower() in identities for name in names)


def _admitted_quantizations(allowed: tuple[str, ...]) -> set[str]:
    return {variant for name in allowed for variant in QUANTIZATION_FAMILIES.get(name, {name})}


def _uptime(endpoint: Endpoint) -> float | None:
    """The last 30 minutes, else the last day. Null in both means too little traffic to measure, which is
    no evidence of downtime, so such an endpoint is kept (status still catches a known outage)."""
    for uptime in (endpoint.get("uptime_last_30m"), endpoint.get("uptime_last_1d")):
        if uptime is not None:
            return float(uptime)
    return None


def _names(config: Mapping[str, Any], key: str) -> tuple[str, ...]:
    value = config.get(key)
    if value is None:
        return ()
    if not isinstance(value, list | tuple) or not all(isinstance(item, str) for item in value):
        raise OpenRouterError(f"routing config: {key} must be a list of strings, got {value!r}")
    return tuple(value)


def _number(config: Mapping[str, Any], key: str) -> float | None:
    value = config.get(key)
    if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)):
        raise OpenRouterError(f"routing config: {key} must be a number or null, got {value!r}")
    return None if value is None else float(value)


def _integer(config: Mapping[str, Any], key: str) -> int | None:
    value = config.get(key)
    if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
        raise OpenRouterError(f"routing config: {key} must be an integer or null, got {value!r}")
    return value
