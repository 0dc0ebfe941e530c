"""The routing policy on endpoint objects shaped like OpenRouter's `/endpoints` answer."""

from __future__ import annotations

from typing import Any

import pytest

from eaglepipe.openrouter.errors import OpenRouterError
from eaglepipe.openrouter.routing import RoutingPolicy, provider_request, select_endpoints


def endpoint(tag: str, **fields: Any) -> dict[str, Any]:
    provider_name = tag.split("/")[0].capitalize()
    return {
        "provider_name": provider_name,
        "tag": tag,
        "quantization": "int4",
        "status": 0,
        "uptime_last_30m": 99.5,
        "uptime_last_1d": 99.0,
        "supported_parameters": ["temperature", "top_p", "max_tokens"],
        "max_completion_tokens": 8192,
        **fields,
    }


def reasons(endpoints: list[dict[str, Any]], **policy: Any) -> dict[str, str]:
    """Tag -> drop reason; kept endpoints map to ""."""
    kept, dropped = select_endpoints(endpoints, RoutingPolicy.from_config(policy))
    assert len(kept) + len(dropped) == len(endpoints)
    return {e["tag"]: "" for e in kept} | {d["endpoint"]["tag"]: d["reason"] for d in dropped}


def test_quantization_filter_and_families() -> None:
    endpoints = [
        endpoint("a", quantization="int4"),
        endpoint("b", quantization="nvfp4"),
        endpoint("c", quantization="mxfp8"),
        endpoint("d", quantization="bf16"),
    ]
    assert reasons(endpoints, quantizations=["int4"]) == {
        "a": "",
        "b": "quantization nvfp4 not in ['int4']",
        "c": "quantization mxfp8 not in ['int4']",
        "d": "quantization bf16 not in ['int4']",
    }
    by_family = reasons(endpoints, quantizations=["fp4", "fp8"])
    assert [tag for tag, reason in by_family.items() if not reason] == ["b", "c"]


def test_unknown_quantization_dropped_unless_allowed() -> None:
    endpoints = [endpoint("a", quantization=None), endpoint("b", quantization="unknown")]
    assert all(reasons(endpoints, quantizations=["int4"]).values())
    assert reasons(endpoints, quantizations=["int4", "unknown"]) == {"a": "", "b": ""}
    assert reasons(endpoints) == {"a": "", "b": ""}, "no quantization filter keeps them"


def test_status_and_uptime() -> None:
    endpoints = [
        endpoint("down", status=-2),
        endpoint("flaky", uptime_last_30m=80.0),
        endpoint("fresh", uptime_last_30m=None, uptime_last_1d=None),
        endpoint("quiet", uptime_last_30m=None, uptime_last_1d=90.0),
    ]
    assert reasons(endpoints, min_uptime=95) == {
        "down": "status -2 (degraded or down)",
        "flaky": "uptime 80% < 95%",
        "fresh": "",
        "quiet": "uptime 90% < 95%",
    }


def test_variant_tags_match_base_slug_full_tag_and_provider_name() -> None:
    endpoints = [
        endpoint("chutes/int4"),
        endpoint("chutes"),
        endpoint("deepinfra/turbo"),
        endpoint("deepinfra"),
    ]
    kept_only = reasons(endpoints, only=["chutes/int4", "DeepInfra"])
    assert [tag for tag, reason in kept_only.items() if not reason] == [
        "chutes/int4",
        "deepinfra/turbo",
        "deepinfra",
    ]
    ignored = reasons(endpoints, ignore=["CHUTES", "deepinfra/turbo"])
    assert [tag for tag, reason in ignored.items() if not reason] == ["deepinfra"]
    assert ignored["chutes/int4"] == "in `ignore`"


def test_required_parameters_and_max_tokens_with_all_reasons_joined() -> None:
    endpoints = [
        endpoint("lean", supported_parameters=["max_tokens"], max_completion_tokens=1024, status=-1),
        endpoint("unknown-limit", max_completion_tokens=None),
    ]
    result = reasons(endpoints, require_parameters=["temperature", "top_p"], max_tokens=4096)
    assert result == {
        "lean": "status -1 (degraded or down); does not support temperature, top_p; "
        "max_completion_tokens 1024 < 4096",
        "unknown-limit": "",
    }


def test_provider_request_pins_kept_tags_in_stable_order() -> None:
    policy = RoutingPolicy.from_config({"quantizations": ["int4"]})
    kept = [endpoint("moonshotai"), endpoint("chutes/int4")]
    assert provider_request(kept, policy) == {
        "only": ["chutes/int4", "moonshotai"],
        "quantizations": ["int4"],
        "allow_fallbacks": False,
        "require_parameters": True,
    }
    assert provider_request(kept[::-1], policy) == provider_request(kept, policy)


@pytest.mark.parametrize(
    ("config", "named"),
    [
        ({"quantisation": ["int4"]}, "'quantisation'"),
        ({"only": "chutes"}, "only"),
        ({"min_uptime": "high"}, "min_uptime"),
    ],
)
def test_bad_config_names_the_key(config: dict[str, Any], named: str) -> None:
    with pytest.raises(OpenRouterError, match=named):
        RoutingPolicy.from_config(config)
