"""The emulator as a client meets it: a real server on loopback answering with the real model."""

from __future__ import annotations

import asyncio
import json
import os

import httpx
import pytest
from support.api_schemas import validate, validate_error

from eaglepipe.emulator.errors import EmulatorError
from eaglepipe.emulator.runner import running_emulator
from eaglepipe.target.chat import render_prompt_ids
from eaglepipe.target.load import load_tokenizer

pytestmark = pytest.mark.slow

MODEL_ID = "local/smollm2-135m-instruct"
STOPS = "Reply with one word: yes or no. Is fire hot?"  # greedy answer "No." then <|im_end|>
PROMPTS = [STOPS, "What is 2+2? Answer with a number only.", "Name a color. One word.", "Say hi."]


@pytest.fixture(scope="module")
def client(emulator_url):
    """The session's shared emulator (tests/conftest.py): default table, no key, no limit."""
    with httpx.Client(base_url=emulator_url, timeout=120) as http:
        yield http


@pytest.fixture(scope="module")
def tokenizer(model_dir):
    return load_tokenizer(model_dir)


@pytest.fixture(scope="module")
def endpoints(client):
    return {e["tag"]: e for e in client.get(f"/models/{MODEL_ID}/endpoints").json()["data"]["endpoints"]}


def chat(prompt: str, **fields) -> dict:
    return {
        "model": MODEL_ID,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": 16,
        "temperature": 0,
        **fields,
    }


def served_tag(answer: dict, endpoints: dict) -> str:
    """The endpoint whose prices reproduce the charged cost (provider names are shared by variants)."""
    usage = answer["usage"]
    tags = [
        tag
        for tag, e in endpoints.items()
        if e["provider_name"] == answer["provider"]
        and abs(
            usage["prompt_tokens"] * float(e["pricing"]["prompt"])
            + usage["completion_tokens"] * float(e["pricing"]["completion"])
            - usage["cost"]
        )
        < 1e-12
    ]
    assert len(tags) == 1, tags
    return tags[0]


def stream_events(client: httpx.Client, body: dict) -> tuple[str, list[str], list[dict]]:
    """(generation id header, non-empty SSE lines, parsed chunks)."""
    with client.stream("POST", "/chat/completions", json={**body, "stream": True}) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in response.iter_lines() if line]
    chunks = [json.loads(line[len("data: ") :]) for line in lines if line.startswith("data: {")]
    return response.headers["x-generation-id"], lines, chunks


def test_catalogue_matches_schemas(client):
    models = client.get("/models").json()
    validate("models", models)
    assert [m["id"] for m in models["data"]] == [MODEL_ID]
    listing = client.get(f"/models/{MODEL_ID}/endpoints").json()
    validate("endpoints", listing)
    assert listing["data"]["id"] == MODEL_ID
    assert {e["quantization"] for e in listing["data"]["endpoints"]} >= {"int4", "bf16", None}


def test_unknown_model_endpoints_is_404_in_openrouter_shape(client):
    response = client.get("/models/nobody/nothing/endpoints")
    assert response.status_code == 404
    validate_error(response.url.path, response.status_code, response.json())
    assert response.json()["error"]["code"] == 404


def test_completion_usage_counts_the_returned_token_ids(client, tokenizer, endpoints):
    response = client.post("/chat/completions", json=chat(STOPS, return_token_ids=True))
    assert response.status_code == 200
    answer = response.json()
    validate("chat_result", answer)
    assert response.headers["x-generation-id"] == answer["id"] and answer["id"].startswith("gen-")
    choice, usage = answer["choices"][0], answer["usage"]
    assert choice["finish_reason"] == "stop" and choice["message"]["reasoning"] is None
    assert usage["completion_tokens"] == len(choice["token_ids"]) + 1  # the stop token is billed
    assert usage["prompt_tokens"] == len(answer["prompt_token_ids"])
    assert answer["prompt_token_ids"] == render_prompt_ids(tokenizer, [{"role": "user", "content": STOPS}])
    assert choice["message"]["content"] == tokenizer.decode(choice["token_ids"]) == "No."
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    assert served_tag(answer, endpoints) == "deepinfra/turbo"


def test_tools_and_tool_turns_render_like_the_token_stage(client, tokenizer):
    tools = [{"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}}]
    messages = [
        {"role": "user", "content": "What time is it?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "get_time", "arguments": "{}"}}
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "12:00"},
    ]
    body = {
        "model": MODEL_ID,
        "messages": messages,
        "tools": tools,
        "max_tokens": 1,
        "return_token_ids": True,
    }
    answer = client.post("/chat/completions", json=body).json()
    assert answer["prompt_token_ids"] == render_prompt_ids(tokenizer, messages, tools)


def test_length_cut_bills_exactly_the_returned_ids(client):
    answer = client.post(
        "/chat/completions", json=chat("Say hi.", max_tokens=3, return_token_ids=True)
    ).json()
    assert answer["choices"][0]["finish_reason"] == "length"
    assert answer["usage"]["completion_tokens"] == len(answer["choices"][0]["token_ids"]) == 3


def test_an_endpoint_may_not_bill_the_stop_token(client):
    body = chat(STOPS, return_token_ids=True, provider={"only": ["fireworks"]})
    answer = client.post("/chat/completions", json=body).json()
    assert answer["provider"] == "Fireworks" and answer["choices"][0]["finish_reason"] == "stop"
    assert answer["usage"]["completion_tokens"] == len(answer["choices"][0]["token_ids"])


def test_generation_record_repeats_provider_tokens_and_cost(client):
    answer = client.post("/chat/completions", json=chat(STOPS, provider={"quantizations": ["int4"]})).json()
    record = client.get("/generation", params={"id": answer["id"]}).json()
    validate("generation", record)
    data, usage = record["data"], answer["usage"]
    assert (data["provider_name"], data["native_tokens_prompt"], data["native_tokens_completion"]) == (
        "Chutes",
        usage["prompt_tokens"],
        usage["completion_tokens"],
    )
    assert data["total_cost"] == pytest.approx(usage["cost"])
    missing = client.get("/generation", params={"id": "gen-unknown"})
    assert missing.status_code == 404
    validate_error(missing.url.path, missing.status_code, missing.json())


def test_stream_gives_the_same_text_ids_and_usage(client):
    body = chat("Write the word café and an emoji.", max_tokens=20, return_token_ids=True)
    whole = client.post("/chat/completions", json=body).json()
    generation_id, lines, chunks = stream_events(client, body)
    assert lines[0] == ": OPENROUTER PROCESSING" and lines[-1] == "data: [DONE]"
    for chunk in chunks:
        validate("chat_chunk", chunk)
    *content_chunks, usage_chunk = chunks
    assert (
        "".join(c["choices"][0]["delta"]["content"] for c in content_chunks)
        == whole["choices"][0]["message"]["content"]
    )
    assert [i for c in content_chunks for i in c["choices"][0].get("token_ids", [])] == whole["choices"][0][
        "token_ids"
    ]
    assert content_chunks[0]["prompt_token_ids"] == whole["prompt_token_ids"]
    assert (
        content_chunks[-1]["choices"][0]["finish_reason"] == whole["choices"][0]["finish_reason"] == "length"
    )
    assert usage_chunk["choices"] == []
    assert {k: usage_chunk["usage"][k] for k in ("prompt_tokens", "completion_tokens", "cost")} == {
        k: whole["usage"][k] for k in ("prompt_tokens", "completion_tokens", "cost")
    }
    assert {c["id"] for c in chunks} == {generation_id}


def test_routing_filters_reach_the_server(client, endpoints):
    def tag_for(provider):
        response = client.post("/chat/completions", json=chat(STOPS, max_tokens=1, provider=provider))
        assert response.status_code == 200, response.text
        return served_tag(response.json(), endpoints)

    assert tag_for({"quantizations": ["int4"]}) == "chutes/int4"
    assert tag_for({"only": ["deepinfra"], "quantizations": ["bf16"]}) == "deepinfra"
    assert tag_for({"quantizations": ["fp4"], "ignore": ["deepinfra"]}) == "baseten"
    for provider, status in [
        ({"quantizations": ["fp16"]}, 404),
        ({"only": ["chutes"], "sorting": "price"}, 400),
    ]:
        response = client.post("/chat/completions", json=chat(STOPS, provider=provider))
        assert response.status_code == status
        validate_error(response.url.path, response.status_code, response.json())
        assert response.json()["error"]["code"] == status


def test_bad_requests_are_400_in_openrouter_shape(client):
    for body in [chat(STOPS, model="nobody/nothing"), {"model": MODEL_ID}, chat(STOPS, max_tokens=-1)]:
        response = client.post("/chat/completions", json=body)
        assert response.status_code == 400
        validate_error(response.url.path, response.status_code, response.json())
    response = client.post("/chat/completions", content=b"{not json")
    assert response.status_code == 400 and "JSON" in response.json()["error"]["message"]


def test_concurrent_requests_are_batched_and_keep_their_greedy_text(client, emulator_url):
    def body(prompt):
        return chat(
            prompt, max_tokens=12, logprobs=True, top_logprobs=0, provider={"quantizations": ["int4"]}
        )

    alone = [client.post("/chat/completions", json=body(p)).json()["choices"][0] for p in PROMPTS]
    before = client.get("/emulator/stats").json()

    async def together():
        async with httpx.AsyncClient(base_url=emulator_url, timeout=120) as http:
            answers = await asyncio.gather(*(http.post("/chat/completions", json=body(p)) for p in PROMPTS))
        return [a.json()["choices"][0] for a in answers]

    batched = asyncio.run(together())
    after = client.get("/emulator/stats").json()
    assert after["largest_batch"] >= 2
    assert after["batched_sequences"] - before["batched_sequences"] == len(PROMPTS)
    assert after["batches"] - before["batches"] < len(PROMPTS)
    assert [c["message"]["content"] for c in batched] == [c["message"]["content"] for c in alone]
    for one, many in zip(alone, batched, strict=True):  # batching moves logits by float32 rounding only
        for a, b in zip(one["logprobs"]["content"], many["logprobs"]["content"], strict=True):
            assert a["token"] == b["token"] and a["logprob"] == pytest.approx(b["logprob"], abs=1e-3)


def test_logprob_bytes_spell_the_content(client):
    body = chat("Write the word café and an emoji.", max_tokens=8, logprobs=True, top_logprobs=2)
    choice = client.post("/chat/completions", json=body).json()["choices"][0]
    content = choice["logprobs"]["content"]
    assert len(content) == 8 and all(len(c["top_logprobs"]) == 2 for c in content)
    assert all(c["top_logprobs"][0]["logprob"] >= c["logprob"] - 1e-6 for c in content)  # greedy = top choice
    text = bytes(b for c in content for b in c["bytes"]).decode("utf-8", errors="replace")
    assert text == choice["message"]["content"]


def test_an_endpoint_without_logprobs_ignores_the_request(client):
    body = chat(STOPS, logprobs=True, provider={"only": ["baseten"]})
    assert client.post("/chat/completions", json=body).json()["choices"][0]["logprobs"] is None


def test_seeded_sampling_repeats(client):
    body = chat("Say hi.", temperature=1.0, top_p=0.9, seed=1234, max_tokens=10)
    first, second = (client.post("/chat/completions", json=body).json() for _ in range(2))
    assert first["choices"][0]["message"]["content"] == second["choices"][0]["message"]["content"]


def test_stats_count_requests_billing_and_tokens(client):
    before = client.get("/emulator/stats").json()
    answer = client.post("/chat/completions", json=chat(STOPS)).json()
    client.post("/chat/completions", json=chat(STOPS, provider={"quantizations": ["fp16"]}))
    after = client.get("/emulator/stats").json()
    assert after["requests_received"] - before["requests_received"] == 2
    assert after["requests_billed"] - before["requests_billed"] == 1
    assert after["usd_charged"] - before["usd_charged"] == pytest.approx(answer["usage"]["cost"])
    assert after["prompt_tokens"] - before["prompt_tokens"] == answer["usage"]["prompt_tokens"]
    assert after["completion_tokens"] - before["completion_tokens"] == answer["usage"]["completion_tokens"]
    assert after["errors"].get("404", 0) - before["errors"].get("404", 0) == 1
    assert client.get("/key").json()["data"]["usage"] == pytest.approx(after["usd_charged"])


# --- a server with a key, a credit limit and its own endpoint table --------------------------------

CONFIG = """
endpoints:
  - {provider_name: Solo, tag: solo/int4, quantization: int4,
     pricing: {prompt: "0.000001", completion: "0.000002"}}
  - {provider_name: Down, tag: down, quantization: bf16, status: -3, pricing: {prompt: "0", completion: "0"}}
"""


def test_key_credit_limit_and_config(model_dir, tmp_path):
    (tmp_path / "key").write_text("sk-or-v1-emulator-test\n")
    (tmp_path / "emulator.yaml").write_text(CONFIG)
    limit = 0.00001  # spent by the first request (about 40 prompt tokens at $1/M)
    args = [
        "--require-key-file",
        str(tmp_path / "key"),
        "--credit-limit",
        str(limit),
        "--config",
        str(tmp_path / "emulator.yaml"),
    ]
    right = {"Authorization": "Bearer sk-or-v1-emulator-test"}
    with (
        running_emulator(model_dir, extra_args=args, log_path=tmp_path / "log") as url,
        httpx.Client(base_url=url, timeout=120) as http,
    ):
        for headers in ({}, {"Authorization": "Bearer sk-or-v1-other"}):
            for response in (
                http.post("/chat/completions", json=chat(STOPS), headers=headers),
                http.get("/key", headers=headers),
            ):
                assert response.status_code == 401
                validate_error(response.url.path, response.status_code, response.json())
        listing = http.get(f"/models/{MODEL_ID}/endpoints").json()["data"]["endpoints"]  # needs no key
        assert [(e["tag"], e["status"]) for e in listing] == [("solo/int4", 0), ("down", -3)]

        key = http.get("/key", headers=right).json()
        validate("key", key)
        data = key["data"]
        assert (data["limit"], data["usage"], data["limit_remaining"]) == (limit, 0, limit)
        answer = http.post("/chat/completions", json=chat(STOPS), headers=right).json()
        assert answer["provider"] == "Solo" and answer["usage"]["cost"] > limit
        refused = http.post("/chat/completions", json=chat(STOPS), headers=right)
        assert refused.status_code == 402
        validate_error(refused.url.path, refused.status_code, refused.json())
        key = http.get("/key", headers=right).json()["data"]
        assert key["usage"] == pytest.approx(answer["usage"]["cost"]) and key["limit_remaining"] == 0
        stats = http.get("/emulator/stats").json()
        assert (stats["requests_billed"], stats["errors"]) == (1, {"401": 2, "402": 1})
    assert "sk-or-v1-emulator-test" not in (tmp_path / "log").read_text()


def test_context_exit_leaves_no_process_even_on_error(model_dir, tmp_path):
    with pytest.raises(KeyError), running_emulator(model_dir, log_path=tmp_path / "log") as url:
        pid = httpx.get(f"{url}/emulator/stats").json()["pid"]
        assert pid != os.getpid()
        raise KeyError("leave the block by an exception")
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    assert "stopped" in (tmp_path / "log").read_text()


def test_startup_failure_reports_the_log(model_dir, tmp_path):
    (tmp_path / "bad.yaml").write_text("endpoints: [{provider_name: A}]\n")
    with (
        pytest.raises(EmulatorError, match="missing key 'tag'"),
        running_emulator(
            model_dir, extra_args=["--config", str(tmp_path / "bad.yaml")], log_path=tmp_path / "log"
        ),
    ):
        pytest.fail("the emulator must not start with a bad config")
