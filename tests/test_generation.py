"""The generation client end to end against the real emulator on loopback: routing, usage, resume,
fingerprints, streaming, credit exhaustion and the API key."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from stage_settings import generation_settings, token_settings

from eaglepipe.answers.asked import generate_responses
from eaglepipe.openrouter.client import GenerationSummary
from eaglepipe.openrouter.dollars import DollarBudget
from eaglepipe.openrouter.errors import OpenRouterError
from eaglepipe.openrouter.fingerprint import request_fingerprint
from eaglepipe.openrouter.journal import RECORDS_FILE, read_records
from eaglepipe.openrouter.ledger import read_ledger
from eaglepipe.openrouter.routing import RoutingPolicy, fetch_providers, provider_request
from eaglepipe.openrouter.secrets import read_api_key
from eaglepipe.openrouter.settings import GenerationSettings
from eaglepipe.target.chat_format import chat_format_for
from eaglepipe.target.load import load_target_tokenizer
from eaglepipe.tokens.methods import Method
from eaglepipe.tokens.rebuild import Rebuilder

MODEL = "local/smollm2-135m-instruct"
SECRET = "sk-or-v1-TESTSECRET0123456789"
QUESTIONS = [
    "Write a long story about a dragon.",
    "Explain photosynthesis in detail.",
    "List ten fruits.",
    "Describe the city of Paris.",
    "What is the history of Rome?",
    "Tell me about the ocean.",
]
PROMPTS = [{"id": f"p{i}", "messages": [{"role": "user", "content": q}]} for i, q in enumerate(QUESTIONS)]
POLICY = RoutingPolicy.from_config(
    {"quantizations": ["int4"], "min_uptime": 90, "require_parameters": ["temperature", "top_p", "seed"]}
)


@pytest.fixture(scope="module")
def provider_obj(emulator_url: str) -> dict[str, Any]:
    return provider_request(fetch_providers(emulator_url, MODEL, None, POLICY)["kept"], POLICY)


def write_prompts(folder: Path, prompts: list[dict[str, Any]]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "prompts.jsonl"
    path.write_text("".join(json.dumps(prompt) + "\n" for prompt in prompts))
    return path


@pytest.fixture
def prompts_path(tmp_path: Path) -> Path:
    return write_prompts(tmp_path / "results" / "demo", PROMPTS)


def settings_for(base_url: str, provider_obj: dict[str, Any] | None, **changes: Any) -> GenerationSettings:
    fields: dict[str, Any] = {
        "base_url": base_url,
        "model": MODEL,
        "max_tokens": 4,
        "sampling": {"temperature": 0.0, "top_p": 1.0, "seed": 0},
        "provider_obj": provider_obj,
        "concurrency": 3,
        "return_token_ids": True,
        "backoff_base_s": 0.05,
        **changes,
    }
    fields["fingerprint"] = request_fingerprint(
        MODEL, "emulator", provider_obj, fields["sampling"], fields["max_tokens"], None
    )
    return generation_settings(**fields)


def billed(base_url: str) -> int:
    return httpx.get(f"{base_url}/emulator/stats").json()["requests_billed"]


def generate(prompts_path: Path, settings: GenerationSettings, api_key: Any = None) -> GenerationSummary:
    folder = prompts_path.parent
    return generate_responses(
        prompts_path,
        folder / "responses.jsonl",
        folder / "summary.json",
        folder / ".journal",
        folder.parent / ".ledger",
        folder.name,
        settings,
        api_key,
    )


def responses(folder: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (folder / "responses.jsonl").read_text().splitlines()]


def test_fetch_providers_keeps_only_what_the_policy_allows(emulator_url: str) -> None:
    providers = fetch_providers(emulator_url, MODEL, None, POLICY)
    assert [endpoint["tag"] for endpoint in providers["kept"]] == ["chutes/int4", "moonshotai"]
    reasons = {item["endpoint"]["tag"]: item["reason"] for item in providers["dropped"]}
    assert "status -2" in reasons["novita"] and "does not support seed" in reasons["baseten"]
    assert providers["source"] == emulator_url and providers["policy"]["quantizations"] == ["int4"]
    with pytest.raises(OpenRouterError, match="no endpoint of .* passes the routing policy.*novita: "):
        fetch_providers(emulator_url, MODEL, None, RoutingPolicy.from_config({"only": ["nobody"]}))


def test_set_generates_in_prompt_order_with_usage(
    emulator_url: str, provider_obj: dict[str, Any], prompts_path: Path
) -> None:
    before = billed(emulator_url)
    summary = generate(prompts_path, settings_for(emulator_url, provider_obj))
    records = responses(prompts_path.parent)
    assert [record["prompt_id"] for record in records] == [prompt["id"] for prompt in PROMPTS]
    for record in records:
        assert record["usage"]["completion_tokens"] == len(record["response"]["token_ids"]) == 4
        assert record["usage"]["cost"] > 0 and record["provider"] in {"Chutes", "Moonshot AI"}
        assert record["response"]["content"] and record["response"]["finish_reason"] == "length"
        assert record["generation_id"] and record["attempts"] == 1
        assert "messages" not in record["request"] and record["request"]["provider"] == provider_obj
    assert billed(emulator_url) - before == len(PROMPTS)
    assert summary.ended_because == "all_done" and summary.truncated == len(PROMPTS)
    assert summary.completion_tokens == 4 * len(PROMPTS)
    saved = json.loads((prompts_path.parent / "summary.json").read_text())
    assert saved["done"] == len(PROMPTS) and saved["dollars"] == pytest.approx(summary.dollars)


def test_budget_stop_then_resume_requests_each_prompt_once(
    emulator_url: str, provider_obj: dict[str, Any], prompts_path: Path
) -> None:
    folder = prompts_path.parent
    before = billed(emulator_url)
    # The token budget completes a set: its responses so far are written, and the summary says why.
    # Until answers are seen each request is expected at max_tokens (4): a third would pass 10 tokens.
    small_budget = settings_for(emulator_url, provider_obj, concurrency=1, output_token_budget=10)
    stopped = generate(prompts_path, small_budget)
    assert stopped.ended_because == "token_budget" and stopped.done == 2
    assert [record["prompt_id"] for record in responses(folder)] == ["p0", "p1"]
    assert json.loads((folder / "summary.json").read_text())["ended_because"] == "token_budget"
    with open(folder / ".journal" / RECORDS_FILE, "a") as journal:  # a kill in the middle of a write
        journal.write('{"prompt_id": "p2", "fingerprint": "')

    summary = generate(prompts_path, settings_for(emulator_url, provider_obj, output_token_budget=1000))
    assert summary.ended_because == "all_done" and summary.resumed == 2
    assert billed(emulator_url) - before == len(PROMPTS)
    assert [record["prompt_id"] for record in responses(folder)] == [prompt["id"] for prompt in PROMPTS]
    assert len(read_records(folder / ".journal")) == len(PROMPTS)


def test_changed_fingerprint_does_not_reuse_old_records(
    emulator_url: str, provider_obj: dict[str, Any], tmp_path: Path
) -> None:
    prompts = PROMPTS[:3]
    folder = tmp_path / "results" / "demo"
    path = write_prompts(folder, prompts)
    generate(path, settings_for(emulator_url, provider_obj))
    before = billed(emulator_url)
    shorter = settings_for(emulator_url, provider_obj, max_tokens=3)
    summary = generate(path, shorter)
    assert summary.resumed == 0 and billed(emulator_url) - before == len(prompts)
    assert {record["fingerprint"] for record in responses(folder)} == {shorter.fingerprint}
    assert all(record["usage"]["completion_tokens"] == 3 for record in responses(folder))
    assert len(read_records(folder / ".journal")) == 2 * len(prompts), "old records stay on disk"

    summary = generate(path, settings_for(emulator_url, provider_obj))
    assert summary.resumed == len(prompts) and billed(emulator_url) - before == len(prompts)


def test_streaming_and_plain_give_the_same_greedy_answer(
    emulator_url: str, provider_obj: dict[str, Any], tmp_path: Path
) -> None:
    answers = {}
    for stream in (False, True):
        folder = tmp_path / f"stream-{stream}" / "results" / "demo"
        generate(
            write_prompts(folder, PROMPTS[:3]),
            settings_for(emulator_url, provider_obj, stream=stream, concurrency=1),
        )
        answers[stream] = [
            (r["response"], r["usage"]["completion_tokens"], r["provider"]) for r in responses(folder)
        ]
    assert answers[True] == answers[False]


def test_permanent_failure_is_recorded_not_kept(
    emulator_url: str, provider_obj: dict[str, Any], tmp_path: Path
) -> None:
    bad = {"id": "bad", "messages": [{"role": "narrator", "content": "no such role"}]}
    folder = tmp_path / "results" / "demo"
    path = write_prompts(folder, [*PROMPTS[:2], bad])
    # A 400 is a final answer: recorded in the summary, absent from the responses, not blocking the set.
    generate(path, settings_for(emulator_url, provider_obj))
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["ended_because"] == "all_done"
    assert summary["failed_permanent"] == 1 and summary["failures"][0]["status"] == 400
    assert sorted(record["prompt_id"] for record in read_records(folder / ".journal")) == ["p0", "p1"]
    assert [record["prompt_id"] for record in responses(folder)] == ["p0", "p1"]


def test_unreachable_server_is_retried_then_left_to_resume(prompts_path: Path) -> None:
    with httpx.Client() as probe, pytest.raises(httpx.ConnectError):
        probe.get("http://127.0.0.1:9/api/v1/models")
    settings = settings_for("http://127.0.0.1:9/api/v1", None, max_attempts=2, backoff_base_s=0.01)
    with pytest.raises(OpenRouterError, match="0/6 prompts done.*ConnectError.*rerun"):
        generate(prompts_path, settings)
    summary = json.loads((prompts_path.parent / "summary.json").read_text())
    assert summary["failed_transient"] == len(PROMPTS) and summary["retries"] == len(PROMPTS)


@pytest.fixture(scope="module")
def guarded_emulator(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """An emulator that wants a key and stops charging after about two requests: (url, right key file)."""
    from eaglepipe.emulator.runner import running_emulator

    folder = tmp_path_factory.mktemp("guarded")
    key_file = folder / "right.key"
    key_file.write_text("sk-or-v1-RIGHTKEY0000000000\n")
    key_file.chmod(0o600)
    with running_emulator(
        model_dir,
        extra_args=["--require-key-file", str(key_file), "--credit-limit", "5e-5"],
        log_path=folder / "emulator.log",
    ) as url:
        yield url, key_file


def files_mentioning(folder: Path, text: str) -> list[Path]:
    return [path for path in folder.rglob("*") if path.is_file() and text in path.read_text(errors="replace")]


@pytest.mark.slow
def test_wrong_key_stops_the_run_and_never_leaks(
    guarded_emulator: tuple[str, Path], prompts_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    url, _ = guarded_emulator
    key_file = prompts_path.parent / "wrong.key"
    key_file.write_text(SECRET)
    key_file.chmod(0o600)
    policy = RoutingPolicy.from_config({"quantizations": ["int4"]})
    with caplog.at_level(logging.DEBUG):
        provider_obj = provider_request(
            fetch_providers(url, MODEL, read_api_key(str(key_file)), policy)["kept"], policy
        )
        with pytest.raises(OpenRouterError) as caught:
            generate(prompts_path, settings_for(url, provider_obj), read_api_key(str(key_file)))
    assert "ended by unauthorized" in str(caught.value) and "API key" in str(caught.value)
    assert SECRET not in str(caught.value) and SECRET not in caplog.text
    assert files_mentioning(prompts_path.parent, SECRET) == [key_file]


@pytest.mark.slow
def test_credit_exhaustion_keeps_everything_billed_and_ends_resumable(
    guarded_emulator: tuple[str, Path], prompts_path: Path
) -> None:
    url, key_file = guarded_emulator
    key = read_api_key(str(key_file))
    provider_obj = provider_request(fetch_providers(url, MODEL, key, POLICY)["kept"], POLICY)
    before = httpx.get(f"{url}/emulator/stats").json()["requests_billed"]
    with pytest.raises(OpenRouterError, match="ended by credit_exhausted.*rerun to resume"):
        generate(prompts_path, settings_for(url, provider_obj, concurrency=2), key)
    billed_now = httpx.get(f"{url}/emulator/stats").json()["requests_billed"] - before
    journaled = read_records(prompts_path.parent / ".journal")
    assert 0 < len(journaled) == billed_now < len(PROMPTS)
    assert not (prompts_path.parent / "responses.jsonl").exists()
    assert files_mentioning(prompts_path.parent, "RIGHTKEY") == []


def test_dollar_budget_counts_the_whole_run_and_stops_before_passing_it(
    emulator_url: str, provider_obj: dict[str, Any], tmp_path: Path
) -> None:
    first = write_prompts(tmp_path / "results" / "set-a", PROMPTS[:3])
    done = generate(first, settings_for(emulator_url, provider_obj))
    spent_by_a = read_ledger(tmp_path / "results" / ".ledger").usd
    assert spent_by_a == pytest.approx(done.dollars) and spent_by_a > 0
    per_request = spent_by_a / 3

    # Set b may spend what is left of a budget of five requests, which set a already used three of.
    second = write_prompts(tmp_path / "results" / "set-b", PROMPTS[3:])
    capped = settings_for(
        emulator_url,
        provider_obj,
        concurrency=1,
        dollar_budget=DollarBudget(policy="in_order", run_usd=per_request * 5.5, set_usd=None),
        expected_request_usd=per_request,
    )
    before = billed(emulator_url)
    with pytest.raises(OpenRouterError, match=r"ended by dollar_budget .*raise budget.usd"):
        generate(second, capped)
    assert billed(emulator_url) - before == 2
    assert read_ledger(tmp_path / "results" / ".ledger").usd <= per_request * 5.5
    assert json.loads((second.parent / "summary.json").read_text())["ended_because"] == "dollar_budget"


@pytest.mark.parametrize("stream", [False, True])
def test_logprobs_asked_for_give_the_token_stage_exact_ids(
    emulator_url: str, provider_obj: dict[str, Any], tmp_path: Path, model_dir: Path, stream: bool
) -> None:
    """generation.logprobs: each token's bytes reach the journal, and the token stage reads the exact ids
    from them (checked against the ids the emulator generated, asked for alongside)."""
    path = write_prompts(tmp_path / "results" / "demo", PROMPTS[:3])
    settings = settings_for(emulator_url, provider_obj, logprobs=True, max_tokens=12, stream=stream)
    assert generate(path, settings).done == 3
    records = responses(path.parent)
    truth = {r["prompt_id"]: r["response"].pop("token_ids") for r in records}  # left: text and logprobs
    target = chat_format_for(load_target_tokenizer(model_dir))
    prompts = {p["id"]: p for p in PROMPTS[:3]}
    samples = Rebuilder(target, token_settings()).rebuild(prompts, records, "test").samples
    assert all(r["response"]["logprobs"]["content"] for r in records)
    for sample in samples:
        assert sample.method == Method.LOGPROB_BYTES and sample.problem is None
        stop = [target.layout.stop] if sample.completion_ids[-1] == target.layout.stop else []
        assert sample.completion_ids == truth[sample.prompt_id] + stop
