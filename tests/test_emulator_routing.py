"""The emulator's endpoint table, routing filters and request checks, without a model or a server."""

from __future__ import annotations

from pathlib import Path

import pytest

from eaglepipe.emulator.chat_request import parse_chat_request
from eaglepipe.emulator.errors import ApiError, EmulatorError
from eaglepipe.emulator.providers import load_endpoints
from eaglepipe.emulator.routing import route, slug_matches

MODEL_ID = "local/smollm2-135m-instruct"


@pytest.fixture(scope="module")
def table():
    return load_endpoints(None, MODEL_ID, 8192)


def served(table, provider, parameters=frozenset(), max_tokens=None) -> str:
    return route(table, provider, requested_parameters=set(parameters), max_tokens=max_tokens).tag


@pytest.mark.parametrize(
    ("provider", "tag"),
    [
        (None, "deepinfra/turbo"),  # cheapest routable; cheaper Novita and chutes/fp8 are down
        ({"quantizations": ["int4"]}, "chutes/int4"),
        ({"quantizations": ["fp4"], "ignore": ["deepinfra"]}, "baseten"),  # base slug ignores both variants
        ({"quantizations": ["fp4"], "ignore": ["baseten"]}, "deepinfra/turbo"),  # fp4 covers nvfp4
        ({"quantizations": ["fp8"]}, "together"),  # fp8 covers mxfp8
        ({"quantizations": ["fp8"], "ignore": ["together"]}, "fireworks"),
        ({"quantizations": ["unknown"]}, "parasail"),
        ({"only": ["chutes"]}, "chutes/int4"),  # base slug: all variants, the live one wins
        ({"only": ["deepinfra"], "quantizations": ["bf16"]}, "deepinfra"),
        ({"only": ["DeepInfra/Turbo"]}, "deepinfra/turbo"),
        ({"order": ["fireworks", "chutes"]}, "fireworks"),
        ({"order": ["novita", "moonshotai"], "allow_fallbacks": False}, "moonshotai"),
        ({"order": ["novita"]}, "deepinfra/turbo"),  # falls back to the cheapest
        ({"quantizations": ["int4"], "max_price": {"prompt": 0.45}}, "chutes/int4"),
        ({"sort": "throughput"}, "parasail"),
        ({"sort": {"by": "latency"}, "quantizations": ["int4"]}, "moonshotai"),
    ],
)
def test_route_picks_the_cheapest_endpoint_left_by_the_filters(table, provider, tag):
    assert served(table, provider) == tag


@pytest.mark.parametrize(
    "provider",
    [
        {"quantizations": ["fp16"]},
        {"only": ["chutes"], "quantizations": ["fp8"]},  # the only Chutes fp8 endpoint is down
        {"only": ["novita"]},
        {"order": ["novita"], "allow_fallbacks": False},
        {"quantizations": ["int4"], "max_price": {"completion": 1.5}},
    ],
)
def test_route_answers_404_when_nothing_is_left(table, provider):
    with pytest.raises(ApiError) as caught:
        served(table, provider)
    assert caught.value.status == 404
    assert caught.value.body()["error"]["metadata"]["reason"] == "constraint_filtered"


def test_null_quantization_matches_no_filter(table):
    with pytest.raises(ApiError):
        served(table, {"only": ["atlascloud"], "quantizations": ["unknown", "int4", "bf16", "fp8", "fp4"]})
    assert served(table, {"only": ["atlascloud"]}) == "atlascloud"


def test_require_parameters_drops_endpoints_that_lack_one(table):
    assert served(table, {"only": ["baseten"]}, {"seed"}) == "baseten"
    with pytest.raises(ApiError) as caught:
        served(table, {"only": ["baseten"], "require_parameters": True}, {"seed"})
    assert caught.value.status == 404


def test_max_tokens_above_an_endpoints_limit_routes_elsewhere(tmp_path):
    config = tmp_path / "emulator.yaml"
    config.write_text(
        "endpoints:\n"
        "  - {provider_name: A, tag: a, quantization: int4, max_completion_tokens: 8,"
        " pricing: {prompt: '0.0000001', completion: '0.0000001'}}\n"
        "  - {provider_name: B, tag: b, quantization: int4,"
        " pricing: {prompt: '0.000001', completion: '0.000002'}}\n"
    )
    endpoints = load_endpoints(config, MODEL_ID, 8192)
    assert served(endpoints, None, max_tokens=8) == "a"
    assert served(endpoints, None, max_tokens=9) == "b"


@pytest.mark.parametrize(
    ("provider", "field"),
    [
        ({"quantisations": ["int4"]}, "provider.quantisations"),
        ({"only": "chutes"}, "provider.only"),
        ({"allow_fallbacks": "no"}, "provider.allow_fallbacks"),
        ({"sort": "cheapest"}, "provider.sort"),
        ({"max_price": {"prompt": "1"}}, "provider.max_price"),
    ],
)
def test_bad_provider_objects_are_400_naming_the_field(table, provider, field):
    with pytest.raises(ApiError) as caught:
        served(table, provider)
    assert caught.value.status == 400
    assert field in caught.value.message


def test_slug_matching():
    assert slug_matches("chutes", "chutes/int4")
    assert slug_matches("chutes/int4", "chutes/int4")
    assert not slug_matches("chutes/int4", "chutes/fp8")
    assert not slug_matches("chute", "chutes")


def test_default_table_has_the_variety_clients_must_handle(table):
    public = [e.public for e in table]
    quantizations = {p["quantization"] for p in public}
    assert quantizations >= {"int4", "bf16", "fp8", "fp4", "nvfp4", "mxfp8", "unknown", None}
    assert any(p["status"] < 0 for p in public)
    assert any(p["uptime_last_5m"] is None or p["uptime_last_1d"] is None for p in public)
    assert any("/" in p["tag"] for p in public)
    assert {e.bills_stop_token for e in table} == {True, False}
    assert all("bills_stop_token" not in p for p in public)


def test_config_replaces_the_table_and_fills_defaults(tmp_path):
    config = tmp_path / "emulator.json"
    config.write_text(
        '{"endpoints": [{"provider_name": "Solo", "tag": "solo/int4", "quantization": "int4",'
        ' "pricing": {"prompt": 1e-7, "completion": "0.000002"}, "bills_stop_token": false}]}'
    )
    (endpoint,) = load_endpoints(config, MODEL_ID, 2048)
    assert endpoint.public["pricing"] == {"prompt": "0.0000001", "completion": "0.000002"}
    assert endpoint.public["context_length"] == 2048 and endpoint.public["status"] == 0
    assert endpoint.bills_stop_token is False


A = "provider_name: A, tag: a, quantization: int4"
FREE = "pricing: {prompt: 0, completion: 0}"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("endpoints: []", "non-empty list"),
        ("providers: []", "one top-level key 'endpoints'"),
        (f"endpoints: [{{{A}}}]", "endpoints[0]: missing key 'pricing'"),
        (f"endpoints: [{{{A}, pricing: {{prompt: '-1', completion: '1'}}}}]", "endpoints[0].pricing.prompt"),
        (f"endpoints: [{{{A}, {FREE}, quant: x}}]", "unknown key 'quant'"),
        (f"endpoints: [{{{A}, {FREE}, status: 1}}]", "'status' must be 0"),
        (f"endpoints: [{{{A}, {FREE}}}, {{{A}, {FREE}}}]", "tag 'a' appears twice"),
        (f"endpoints: [{{{A}, {FREE}, bills_stop_token: maybe}}]", "'bills_stop_token' must be true"),
        ("endpoints: [", "cannot read emulator config"),
    ],
)
def test_bad_config_is_one_line_naming_file_and_key(tmp_path, text, message):
    config = tmp_path / "emulator.yaml"
    config.write_text(text)
    with pytest.raises(EmulatorError) as caught:
        load_endpoints(config, MODEL_ID, 8192)
    assert str(config) in str(caught.value)
    assert message in str(caught.value)


def test_missing_config_file_names_it():
    with pytest.raises(EmulatorError, match="nowhere.yaml"):
        load_endpoints(Path("/nowhere.yaml"), MODEL_ID, 8192)


def _chat(**fields):
    return {"model": MODEL_ID, "messages": [{"role": "user", "content": "hi"}], **fields}


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ([], "JSON object"),
        ({"messages": [{"role": "user", "content": "hi"}]}, "model"),
        (_chat(messages=[]), "messages"),
        (_chat(messages=[{"role": "robot", "content": "hi"}]), "messages[0]"),
        (_chat(messages=[{"role": "user", "content": [{"type": "image_url"}]}]), "messages[0].content"),
        (_chat(max_tokens=0), "max_tokens"),
        (_chat(max_tokens=True), "max_tokens"),
        (_chat(temperature=3), "temperature"),
        (_chat(top_p=0), "top_p"),
        (_chat(top_logprobs=21), "top_logprobs"),
        (_chat(stream="yes"), "stream"),
        (_chat(provider=["chutes"]), "provider"),
        (_chat(tools={"name": "x"}), "tools"),
    ],
)
def test_bad_requests_are_400_naming_the_field(body, field):
    with pytest.raises(ApiError) as caught:
        parse_chat_request(body)
    assert caught.value.status == 400
    assert field in caught.value.message


def test_request_parameters_feed_require_parameters():
    request = parse_chat_request(_chat(max_completion_tokens=5, seed=3, stop=["x"], stream=True, usage={}))
    assert request.max_tokens == 5
    assert request.parameters == {"max_tokens", "seed", "stop"}


def test_text_parts_become_plain_content():
    parts = [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]
    request = parse_chat_request(_chat(messages=[{"role": "user", "content": parts}]))
    assert request.messages[0]["content"] == "ab"
