"""Synthetic mode as a client meets it: a real server on loopback, made-up answers, real billing."""

from __future__ import annotations

import asyncio
import json
import math
import statistics
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from support.api_schemas import validate, validate_error
from support.emulator import running_emulator
from support.emulator.__main__ import parse_args

MODEL_ID = "local/smollm2-135m-instruct"
INSTANT = ["--latency-s", "0", "--tokens-per-s", "0"]


def chat(prompt: str, **fields) -> dict:
    return {"model": MODEL_ID, "messages": [{"role": "user", "content": prompt}], **fields}


def stream_chunks(http: httpx.Client, body: dict) -> list[dict]:
    with http.stream("POST", "/chat/completions", json={**body, "stream": True}) as response:
        assert response.status_code == 200
        lines = [line for line in response.iter_lines() if line]
    assert lines[0] == ": OPENROUTER PROCESSING" and lines[-1] == "data: [DONE]"
    return [json.loads(line.removeprefix("data: ")) for line in lines[1:-1]]


def stats(http: httpx.Client) -> dict:
    return http.get("/emulator/stats").json()


@pytest.fixture(scope="module")
def http(tmp_path_factory: pytest.TempPathFactory) -> Iterator[httpx.Client]:
    """Instant answers of about 40 words, four tokens per streamed chunk."""
    log = tmp_path_factory.mktemp("synthetic") / "emulator.log"
    args = [*INSTANT, "--mean-tokens", "40", "--seed", "5", "--tokens-per-event", "4"]
    with running_emulator(None, extra_args=args, log_path=log) as url, httpx.Client(base_url=url) as session:
        yield session


@pytest.fixture(scope="module")
def paced(tmp_path_factory: pytest.TempPathFactory) -> Iterator[httpx.Client]:
    """100 tokens/s, every answer runs to max_tokens, /generation waits 0.3 s."""
    log = tmp_path_factory.mktemp("paced") / "emulator.log"
    args = ["--latency-s", "0", "--tokens-per-s", "100", "--mean-tokens", "1000", "--length-sigma", "0"]
    with (
        running_emulator(None, extra_args=[*args, "--generation-delay-s", "0.3"], log_path=log) as url,
        httpx.Client(base_url=url) as session,
    ):
        yield session


def test_synthetic_mode_starts_fast_and_never_imports_torch(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("PYTHONPROFILEIMPORTTIME", "1")  # the server logs every module it imports
    log = tmp_path / "emulator.log"
    started = time.monotonic()
    with running_emulator(None, extra_args=INSTANT, log_path=log) as url:
        startup_s = time.monotonic() - started
        body = chat("Hi", max_tokens=5, logprobs=True, top_logprobs=2, return_token_ids=True)
        with httpx.Client(base_url=url) as session:
            assert session.post("/chat/completions", json=body).status_code == 200
            stream_chunks(session, body)
    imported = {line.rpartition("|")[2].strip() for line in log.read_text().splitlines() if "|" in line}
    assert "starlette" in imported  # the log really lists the imports
    assert not {name for name in imported if name.split(".")[0] in ("torch", "transformers")}
    assert startup_s < 2.0


def test_answer_lengths_are_heavy_tailed_and_capped_by_max_tokens(http: httpx.Client) -> None:
    async def answers() -> list[dict]:
        # 300 at once through 100 connections: a busy machine may take longer than httpx's 5 s pool wait.
        async with httpx.AsyncClient(base_url=str(http.base_url), timeout=120) as client:
            bodies = [
                chat(f"Question number {i}?", max_tokens=150, seed=i, return_token_ids=True)
                for i in range(300)
            ]
            replies = await asyncio.gather(*(client.post("/chat/completions", json=b) for b in bodies))
        return [reply.json() for reply in replies]

    choices = [answer["choices"][0] for answer in asyncio.run(answers())]
    words = [len(choice["token_ids"]) for choice in choices]
    cut = [choice for choice in choices if choice["finish_reason"] == "length"]
    assert {choice["finish_reason"] for choice in choices} == {"stop", "length"}
    assert 3 <= len(cut) <= 30 and all(len(choice["token_ids"]) == 150 for choice in cut)
    assert 30 < statistics.mean(words) < 46  # lognormal of mean 40, less what max_tokens cut off
    assert statistics.median(words) < statistics.mean(words) and len(set(words)) > 60


def test_stream_and_whole_answer_agree_and_count_their_token_ids(http: httpx.Client) -> None:
    prompt = "Tell me about synthetic words, café."
    body = chat(prompt, seed=11, return_token_ids=True)
    whole = http.post("/chat/completions", json=body).json()
    validate("chat_result", whole)
    choice, usage = whole["choices"][0], whole["usage"]
    assert choice["finish_reason"] == "stop"
    assert usage["completion_tokens"] == len(choice["token_ids"]) + 1  # DeepInfra bills the stop token
    rendered = f"<|im_start|>user\n{prompt}<|im_end|>\n<|im_start|>assistant\n".encode()
    assert usage["prompt_tokens"] == len(whole["prompt_token_ids"]) == math.ceil(len(rendered) / 4)

    *content, finish, usage_chunk = stream_chunks(http, body)
    for chunk in [*content, finish, usage_chunk]:
        validate("chat_chunk", chunk)
    sizes = [len(chunk["choices"][0]["token_ids"]) for chunk in content]
    assert len(content) == math.ceil(len(choice["token_ids"]) / 4) and set(sizes[:-1]) == {4}
    assert [i for chunk in content for i in chunk["choices"][0]["token_ids"]] == choice["token_ids"]
    assert (
        "".join(chunk["choices"][0]["delta"]["content"] for chunk in content) == choice["message"]["content"]
    )
    assert content[0]["prompt_token_ids"] == whole["prompt_token_ids"]
    assert finish["choices"][0]["finish_reason"] == "stop" and usage_chunk["choices"] == []
    assert usage_chunk["usage"]["cost"] == usage["cost"]

    unbilled_stop = http.post("/chat/completions", json={**body, "provider": {"only": ["fireworks"]}}).json()
    assert unbilled_stop["provider"] == "Fireworks"
    assert unbilled_stop["usage"]["completion_tokens"] == len(unbilled_stop["choices"][0]["token_ids"])


def test_greedy_answers_repeat_and_differ_between_prompts(http: httpx.Client) -> None:
    def text(prompt: str, **fields) -> str:
        return http.post("/chat/completions", json=chat(prompt, **fields)).json()["choices"][0]["message"][
            "content"
        ]

    assert text("Same prompt", temperature=0) == text("Same prompt", temperature=0)
    assert text("Same prompt", temperature=0) != text("Other prompt", temperature=0)
    assert text("Same prompt") != text("Same prompt")  # sampled without a seed: a new answer each time


def test_billing_counters_equal_the_costs_returned(http: httpx.Client) -> None:
    before = stats(http)
    costs = []
    for i, provider in enumerate([None, {"only": ["chutes"]}, {"quantizations": ["bf16"]}] * 4):
        body = chat(f"Bill me {i}", max_tokens=60, provider=provider)
        if i % 2:
            costs.append(stream_chunks(http, body)[-1]["usage"]["cost"])
        else:
            answer = http.post("/chat/completions", json=body).json()
            record = http.get("/generation", params={"id": answer["id"]}).json()["data"]
            assert record["total_cost"] == answer["usage"]["cost"]
            assert record["provider_name"] == answer["provider"]
            costs.append(answer["usage"]["cost"])
    after = stats(http)
    assert after["usd_charged"] - before["usd_charged"] == pytest.approx(sum(costs), rel=1e-9)
    assert after["requests_billed"] - before["requests_billed"] == len(costs)
    assert after["responses_completed"] - before["responses_completed"] == len(costs)
    assert after["in_flight"] == 0
    assert http.get("/key").json()["data"]["usage"] == pytest.approx(after["usd_charged"])


def test_credit_limit_stops_the_run_until_raised_live(http: httpx.Client) -> None:
    spent = stats(http)["usd_charged"]
    answer = http.post("/emulator/credit", json={"limit": spent}).json()
    assert answer == {"limit": spent, "key_limit": None, "in_flight_budget": None, "usage": spent}
    refused = http.post("/chat/completions", json=chat("Out of credit?"))
    assert refused.status_code == 402
    validate_error(refused.url.path, refused.status_code, refused.json())
    assert http.get("/key").json()["data"]["limit_remaining"] == 0
    assert http.post("/emulator/credit", json={"limit": spent + 1}).status_code == 200
    assert http.post("/chat/completions", json=chat("Credit again")).status_code == 200
    for bad in ({"limit": -1}, {"limit": "5"}, {"credit": 5}, [5]):
        assert http.post("/emulator/credit", json=bad).status_code == 400
    assert http.post("/emulator/credit", json={"limit": None}).json()["limit"] is None
    assert stats(http)["errors"]["402"] == 1


def test_key_limit_and_a_too_dear_request_answer_as_openrouter_documents(http: httpx.Client) -> None:
    spent = stats(http)["usd_charged"]
    http.post("/emulator/credit", json={"key_limit": spent}).raise_for_status()
    try:
        refused = http.post("/chat/completions", json=chat("Key spent?"))
        assert refused.status_code == 403
        validate_error(refused.url.path, refused.status_code, refused.json())
        metadata = refused.json()["error"]["metadata"]
        assert metadata["limit_source"] == "openrouter_key_limit" and metadata["limit_usd"] == spent
        assert http.get("/key").json()["data"]["limit_remaining"] == 0

        http.post("/emulator/credit", json={"key_limit": None, "in_flight_budget": 1e-6}).raise_for_status()
        too_dear = http.post("/chat/completions", json=chat("Too dear?", max_tokens=50))
        assert too_dear.status_code == 402
        validate_error(too_dear.url.path, too_dear.status_code, too_dear.json())
        error = too_dear.json()["error"]
        assert "fewer max_tokens" in error["message"]
        assert error["metadata"]["reason"] == "weight_exceeds_budget"
    finally:
        http.post("/emulator/credit", json={"key_limit": None, "in_flight_budget": None}).raise_for_status()
    assert http.post("/chat/completions", json=chat("Fine again")).status_code == 200
    assert stats(http)["reserved_usd"] == pytest.approx(0.0, abs=1e-12)


def test_a_client_that_disconnects_is_billed_for_the_whole_answer(paced: httpx.Client) -> None:
    body = chat("Stream and leave", max_tokens=40, seed=3)
    reference = paced.post("/chat/completions", json=body).json()  # 40 tokens at 100/s: 0.4 s
    before = stats(paced)
    with paced.stream("POST", "/chat/completions", json={**body, "stream": True}) as response:
        generation_id = response.headers["x-generation-id"]
        next(line for line in response.iter_lines() if line.startswith("data:"))
    left = stats(paced)
    assert left["in_flight"] == 1 and left["usd_charged"] == before["usd_charged"]  # still generating

    deadline = time.monotonic() + 5
    while (reply := paced.get("/generation", params={"id": generation_id})).status_code == 404:
        assert time.monotonic() < deadline, "the dropped stream was never billed"
        time.sleep(0.05)
    record = reply.json()["data"]
    assert record["cancelled"] and record["finish_reason"] == "length"
    assert record["tokens_completion"] == 40 and record["generation_time"] >= 390
    assert record["total_cost"] == reference["usage"]["cost"]
    after = stats(paced)
    assert after["usd_charged"] - before["usd_charged"] == pytest.approx(reference["usage"]["cost"])
    assert after["in_flight"] == 0 and after["responses_completed"] - before["responses_completed"] == 1


def test_generation_record_appears_only_after_the_delay(paced: httpx.Client) -> None:
    answer = paced.post("/chat/completions", json=chat("Quick", max_tokens=2)).json()
    early = paced.get("/generation", params={"id": answer["id"]})
    assert early.status_code == 404
    validate_error(early.url.path, early.status_code, early.json())
    time.sleep(0.35)
    assert paced.get("/generation", params={"id": answer["id"]}).json()["data"]["total_cost"] > 0


def test_in_flight_counts_the_requests_being_answered(paced: httpx.Client) -> None:
    async def run() -> tuple[int, list[int]]:
        async with httpx.AsyncClient(base_url=str(paced.base_url)) as client:
            requests = [
                asyncio.create_task(client.post("/chat/completions", json=chat(f"n{i}", max_tokens=40)))
                for i in range(10)
            ]
            await asyncio.sleep(0.2)
            during = (await client.get("/emulator/stats")).json()["in_flight"]
            return during, [reply.status_code for reply in await asyncio.gather(*requests)]

    during, statuses = asyncio.run(run())
    assert during == 10 and statuses == [200] * 10
    assert stats(paced)["in_flight"] == 0


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--model-dir", "m", "--synthetic"], "not allowed with argument"),
        ([], "one of the arguments --model-dir --synthetic is required"),
        (["--model-dir", "m", "--mean-tokens", "40"], "--mean-tokens applies only with --synthetic"),
        (["--synthetic", "--tokens-per-s", "-1"], "--tokens-per-s must be at least 0"),
        (["--synthetic", "--tokens-per-event", "0"], "--tokens-per-event must be at least 1"),
    ],
)
def test_the_command_line_takes_one_mode_and_sane_numbers(argv: list[str], message: str, capsys) -> None:
    with pytest.raises(SystemExit) as exit_info:
        parse_args(argv)
    assert exit_info.value.code == 2 and message in capsys.readouterr().err
