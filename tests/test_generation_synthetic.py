"""The generation client in-process against the synthetic emulator on loopback: the key's own limit, an
engine set (the emulator standing in for the team's server), the progress line and the per-provider
accounts."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from stage_settings import default_config, generation_settings
from support.answers import answer_engine_set
from support.emulator import running_emulator

from eaglepipe.openrouter.client import GenerationSummary, generate_set
from eaglepipe.openrouter.console import ProgressLine
from eaglepipe.openrouter.ledger import read_ledger

MODEL = "moonshotai/kimi-k2.5"


@pytest.fixture(scope="module")
def synthetic_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    log = tmp_path_factory.mktemp("synthetic") / "emulator.log"
    args = [
        "--model-id",
        MODEL,
        "--seed",
        "3",
        "--tokens-per-s",
        "0",
        "--latency-s",
        "0.01",
        "--mean-tokens",
        "40",
    ]
    with running_emulator(None, extra_args=args, log_path=log) as url:
        yield url


def prompts(count: int) -> list[dict[str, Any]]:
    return [{"id": f"p{i}", "messages": [{"role": "user", "content": f"question {i}"}]} for i in range(count)]


def generate(url: str, results: Path, count: int, **changes: Any) -> GenerationSummary:
    fields: dict[str, Any] = {
        "base_url": url,
        "model": MODEL,
        "fingerprint": "f",
        "max_tokens": 200,
        "concurrency": 8,
        "progress": False,
        "recovery_wait_s": 0.0,
        **changes,
    }
    settings = generation_settings(**fields)

    async def run() -> GenerationSummary:
        return await generate_set(
            prompts(count),
            settings=settings,
            api_key=None,
            journal_dir=results / "s" / ".journal",
            ledger_dir=results / ".ledger",
            dataset="s",
        )

    return anyio.run(run)


def stats(url: str) -> dict[str, Any]:
    return httpx.get(f"{url}/emulator/stats").json()


def test_a_key_whose_limit_is_spent_stops_before_any_request(synthetic_url: str, tmp_path: Path) -> None:
    spent = stats(synthetic_url)["usd_charged"]
    httpx.post(f"{synthetic_url}/emulator/credit", json={"limit": spent}).raise_for_status()
    try:
        before = stats(synthetic_url)["requests_received"]
        summary = generate(synthetic_url, tmp_path / "results", 5, expected_request_usd=0.001)
    finally:
        httpx.post(f"{synthetic_url}/emulator/credit", json={"limit": None}).raise_for_status()
    assert summary.ended_because == "key_limit" and "limit_remaining" in summary.message
    assert summary.done == 0 and stats(synthetic_url)["requests_received"] == before


def test_summary_accounts_per_provider_and_reconciles_with_the_key(
    synthetic_url: str, tmp_path: Path
) -> None:
    summary = generate(synthetic_url, tmp_path / "results", 30, stream=False)
    assert summary.ended_because == "all_done" and summary.done == 30
    assert sum(row["requests"] for row in summary.providers.values()) == 30
    assert sum(row["completion_tokens"] for row in summary.providers.values()) == summary.completion_tokens
    assert summary.billed_by_outcome == {"kept": 30}
    assert summary.job_ledger_dollars == pytest.approx(summary.dollars)
    assert summary.key_usage_end - summary.key_usage_start == pytest.approx(summary.job_ledger_dollars)
    assert read_ledger(tmp_path / "results" / ".ledger").usd == pytest.approx(summary.dollars)


def test_an_engine_set_gets_no_routing_no_key_no_dollars_and_keeps_its_token_ids(
    synthetic_url: str, tmp_path: Path
) -> None:
    config = default_config(
        api={"model": MODEL, "key_file_env": "EAGLEPIPE_TEST_NO_SUCH_VARIABLE"},
        answers={"source": "engine"},
        engine={"base_url": synthetic_url, "model": MODEL},
        generation={"max_tokens": 64, "concurrency": 4, "max_attempts": 2, "request_timeout_s": 60,
                    "probe_answers": 20},  # no tokenizer at target.path: the job says so, goes on without
        target={"name": "t", "path": str(tmp_path / "none")},
    )
    results = tmp_path / "results"
    results.mkdir()
    prompt_file = results / "prompts.jsonl"
    prompt_file.write_text("".join(json.dumps(p) + "\n" for p in prompts(4)))
    summary = answer_engine_set(
        config,
        prompt_file,
        results / "s",
        ledger=results / ".engine-ledger",
        engine_log=results / "engine.log",
        output_token_budget=10_000,
    )
    assert summary["done"] == 4 and summary["dollars"] == 0
    for line in (results / "s" / "responses.jsonl").read_text().splitlines():
        record = json.loads(line)
        assert record["source"] == "engine"
        assert "provider" not in record["request"] and record["request"]["return_token_ids"] is True
        assert record["usage"]["cost"] == 0
        billed = record["usage"]["completion_tokens"]  # the stop token is billed on some endpoints only
        assert len(record["response"]["token_ids"]) in {billed, billed - 1}
    assert read_ledger(results / ".engine-ledger").usd == 0
    assert not (results / ".ledger").exists()


def test_progress_redraws_on_a_terminal_and_leaves_a_log_to_the_logger() -> None:
    """In a log the logger's own progress lines are the only copy: each line once, not twice."""
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    terminal, log = Terminal(), io.StringIO()
    for stream in (terminal, log):
        line = ProgressLine(stream)
        line.show("a")
        line.show("b")
        line.close("end")
    assert terminal.getvalue() == "\r\x1b[2Ka\r\x1b[2Kb\r\x1b[2Kend\n"
    assert log.getvalue() == ""


@pytest.mark.slow
def test_a_balance_sized_in_flight_budget_is_waited_out_at_high_concurrency(tmp_path: Path) -> None:
    """The seeds' first second, scaled down: 200 workers whose worst case (4,096 tokens at up to $2.8/M,
    about $0.0115 each) would reserve ~$2.3, against an in-flight budget of $0.04 (a handful of requests).
    OpenRouter answers 402 openrouter_in_flight_budget with Retry-After; the set must still finish, with
    the concurrency lowered, every prompt answered once and the ledger equal to what was charged."""
    args = ["--model-id", MODEL, "--seed", "5", "--tokens-per-s", "400", "--latency-s", "0.05",
            "--mean-tokens", "40", "--in-flight-budget", "0.04"]
    with running_emulator(None, extra_args=args, log_path=tmp_path / "emulator.log") as url:
        summary = generate(url, tmp_path / "results", 150, concurrency=200, max_tokens=4096,
                           expected_request_usd=0.0115, backoff_base_s=0.2)
        charged = stats(url)
    assert summary.ended_because == "all_done" and summary.done == 150
    assert summary.errors_by_class["in_flight_budget"] > 0
    assert summary.concurrency_lowest < 200 and summary.concurrency_cuts > 0
    assert charged["requests_billed"] == 150 and charged["reserved_usd"] == pytest.approx(0.0, abs=1e-9)
    assert read_ledger(tmp_path / "results" / ".ledger").usd == pytest.approx(charged["usd_charged"])
