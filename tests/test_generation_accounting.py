"""The client against the synthetic emulator's accounting faults, over real HTTP on loopback: answers
without a cost, cut-offs the provider keeps billing, `/generation` and `/key` failing, keep-alive comments
during stalls, a provider whose display name drifts, and answers rebuilt from `/generation/content`. In
every case the ledger ends equal to what the emulator charged, and no prompt is bought twice."""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
import yaml
from stage_settings import generation_settings
from support.api_schemas import validate
from support.emulator import running_emulator

from eaglepipe.openrouter.client import (
    GenerationSummary,
    generate_set,
    prompt_tokens_bound,
)
from eaglepipe.openrouter.console import ProviderStats
from eaglepipe.openrouter.journal import read_records
from eaglepipe.openrouter.ledger import read_ledger
from eaglepipe.openrouter.secrets import read_api_key
from eaglepipe.tokens.reply import parse_reply

MODEL = "local/smollm2-135m-instruct"
FAST = [
    "--latency-s",
    "0",
    "--tokens-per-s",
    "0",
    "--mean-tokens",
    "12",
    "--length-sigma",
    "0.3",
    "--seed",
    "1",
]
CHUTES = {"provider_name": "Chutes", "tag": "chutes", "quantization": "int4", "price_per_m": [0.4, 2.0]}
PROMPTS = [{"id": f"p{i}", "messages": [{"role": "user", "content": f"Question {i}?"}]} for i in range(8)]
TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}]
SECRET = "sk-or-v1-ACCOUNTINGSECRET0123456789"


@contextmanager
def emulator(
    folder: Path, faults: list[dict[str, Any]], *args: str, endpoint: dict[str, Any] = CHUTES
) -> Iterator[str]:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "faults.yaml").write_text(yaml.safe_dump(faults))
    (folder / "endpoints.yaml").write_text(yaml.safe_dump({"endpoints": [endpoint]}))
    extra = [
        *FAST,
        "--faults",
        str(folder / "faults.yaml"),
        "--config",
        str(folder / "endpoints.yaml"),
        *args,
    ]
    with running_emulator(None, extra_args=extra, log_path=folder / "emulator.log") as url:
        yield url


def generate(
    url: str, folder: Path, prompts: list[dict[str, Any]] = PROMPTS, api_key: Any = None, **changes: Any
) -> GenerationSummary:
    settings = generation_settings(
        **{
            "base_url": url,
            "model": MODEL,
            "fingerprint": "f",
            "max_tokens": 64,
            "provider_obj": {"only": ["chutes"], "allow_fallbacks": False},
            "allowed_providers": ("Chutes",),
            "endpoint_tags": (("Chutes", "chutes"),),
            "concurrency": 3,
            "max_attempts": 8,
            "backoff_base_s": 0.01,
            "recovery_wait_s": 20.0,
            "progress": False,
            **changes,
        }
    )

    async def run() -> GenerationSummary:
        return await generate_set(
            prompts,
            settings=settings,
            api_key=api_key,
            journal_dir=folder / "journal",
            ledger_dir=folder / "ledger",
            dataset="s",
        )

    return anyio.run(run)


def stats(url: str) -> dict[str, Any]:
    return httpx.get(f"{url}/emulator/stats").json()


def assert_ledger_equals_charges(url: str, folder: Path) -> None:
    view = read_ledger(folder / "ledger")
    assert not view.unresolved
    assert view.usd == pytest.approx(stats(url)["usd_charged"], rel=1e-9)


def journaled_once(folder: Path) -> dict[str, dict[str, Any]]:
    records = read_records(folder / "journal")
    counts = Counter(record["prompt_id"] for record in records)
    assert set(counts.values()) <= {1}, counts
    return {record["prompt_id"]: record for record in records}


@pytest.mark.parametrize("stream", [True, False])
def test_answers_without_a_cost_are_priced_by_generation_through_its_errors(
    tmp_path: Path, stream: bool
) -> None:
    """No usage chunk or `cost: null`: held at worst case, then priced by `/generation`, which answers 500
    two times in five (asked again with back-off); `/key` answers 503 throughout, which leaves the key's usage
    unknown and stops nothing."""
    faults = [
        {"fault": "no_usage", "probability": 0.3},
        {"fault": "null_cost", "probability": 0.3},
        {"fault": "status", "status": 500, "probability": 0.4, "route": "generation"},
        {"fault": "status", "status": 503, "probability": 1.0, "route": "key", "retry_after_s": 1},
    ]
    with emulator(tmp_path / "emulator", faults) as url:
        summary = generate(url, tmp_path, stream=stream)
        seen = stats(url)
        assert_ledger_equals_charges(url, tmp_path)
    unpriced = seen["faults"]["no_usage"] + seen["faults"]["null_cost"]
    assert summary.ended_because == "all_done" and summary.done == len(PROMPTS)
    assert unpriced > 0 and summary.recovered == unpriced and summary.unresolved == 0
    assert seen["faults"]["status@generation"] > 0 and seen["faults"]["status@key"] >= 2
    assert summary.key_usage_start is None and summary.key_usage_end is None
    assert seen["requests_received"] == len(PROMPTS)  # nothing bought twice
    records = journaled_once(tmp_path)
    held = [record for record in records.values() if record["usage"]["cost"] is None]
    assert len(held) == unpriced  # journaled as answered, priced only in the ledger
    assert read_ledger(tmp_path / "ledger").by_outcome == {
        "kept": len(PROMPTS) - unpriced,
        "recovered": unpriced,
    }


@pytest.mark.parametrize("stream", [True, False])
def test_bills_written_behind_and_lost_in_a_kill_are_charged_from_the_journal(
    tmp_path: Path, stream: bool
) -> None:
    """A kept answer's bill is written behind its journal record, not waited for: a kill between the two
    leaves a journaled answer the ledger never billed (its `started` line, where it has one, unresolved).
    The next start charges it from the journal record, once, and buys nothing again."""
    with emulator(tmp_path / "emulator", []) as url:
        first = generate(url, tmp_path, stream=stream)
        assert first.done == len(PROMPTS)
        ledger_file = tmp_path / "ledger" / "ledger.jsonl"
        lines = ledger_file.read_text().splitlines(keepends=True)
        billed = [line for line in lines if '"event":"billed"' in line]
        assert len(billed) == len(PROMPTS)
        ledger_file.write_text("".join(line for line in lines if line not in billed[3:]))  # lost in a kill
        bought = stats(url)["requests_received"]
        second = generate(url, tmp_path, stream=stream)
        assert stats(url)["requests_received"] == bought  # nothing bought again
        assert_ledger_equals_charges(url, tmp_path)
    assert second.resumed == len(PROMPTS) and second.unresolved == 0 and second.recovered == 0
    assert read_ledger(tmp_path / "ledger").by_outcome == {"kept": len(PROMPTS)}


DELAY_S = 4.0


@pytest.mark.slow
@pytest.mark.parametrize("stream", [True, False])
def test_cutoffs_still_unknown_at_the_end_are_settled_by_the_next_start(tmp_path: Path, stream: bool) -> None:
    """A cut connection whose answer the provider runs out and bills, with `/generation` answering 404
    longer than the client waits: the run ends with them held at worst case; the next start prices them,
    buying nothing."""
    faults = [{"fault": "cutoff", "probability": 0.4, "after_tokens": 2}]
    # /generation learns of an answer DELAY_S after it ends: long enough that a loaded machine's first run
    # still ends before it does.
    with emulator(tmp_path / "emulator", faults, "--generation-delay-s", str(DELAY_S)) as url:
        first = generate(url, tmp_path, stream=stream, recovery_wait_s=0.2)
        cut = stats(url)["faults"]["cutoff"]
        assert first.ended_because == "all_done" and first.done == len(PROMPTS)
        assert cut > 0 and first.unresolved == cut and first.recovered == 0
        time.sleep(DELAY_S + 0.1)
        bought = stats(url)["requests_received"]
        second = generate(url, tmp_path, stream=stream, recovery_wait_s=0.2)
        assert stats(url)["requests_received"] == bought  # nothing bought again
        assert_ledger_equals_charges(url, tmp_path)
    assert second.resumed == len(PROMPTS) and second.recovered == cut and second.unresolved == 0
    assert read_ledger(tmp_path / "ledger").by_outcome == {"kept": len(PROMPTS), "recovered": cut}
    assert len(journaled_once(tmp_path)) == len(PROMPTS)


def test_keep_alive_comments_during_a_stall_are_skipped(tmp_path: Path) -> None:
    with emulator(tmp_path / "emulator", [{"fault": "stall", "probability": 1.0, "seconds": 1.2}]) as url:
        summary = generate(url, tmp_path, prompts=PROMPTS[:3])
        assert_ledger_equals_charges(url, tmp_path)
        with httpx.stream(
            "POST",
            f"{url}/chat/completions",
            json={"model": MODEL, "stream": True, "messages": PROMPTS[0]["messages"]},
        ) as response:
            comments = [line for line in response.iter_lines() if line.startswith(":")]
    assert comments == [": OPENROUTER PROCESSING"] * 3  # one at once, then one a second while it waits
    assert summary.ended_because == "all_done" and summary.done == 3 and summary.errors_by_class == {}


def test_a_drifted_display_name_stops_the_run_resumable_with_every_discard_charged(tmp_path: Path) -> None:
    """Routing kept Chutes, its answers say "Chutes (beta)": each is paid and discarded, never bought twice
    as a kept answer, and the breaker stops the run with the advice to refresh providers.json."""
    key_file = tmp_path / "key"
    key_file.write_text(SECRET)
    drifted = {**CHUTES, "answers_as": "Chutes (beta)"}
    with emulator(tmp_path / "emulator", [], "--require-key-file", str(key_file), endpoint=drifted) as url:
        summary = generate(url, tmp_path / "run", api_key=read_api_key(str(key_file)), concurrency=1)
        seen = stats(url)
        assert_ledger_equals_charges(url, tmp_path / "run")
    assert summary.ended_because == "foreign_provider" and "providers.json" in summary.message
    assert summary.done == 0 and summary.breaker["discarded_from"] == {
        "Chutes (beta)": seen["requests_billed"]
    }
    assert read_ledger(tmp_path / "run" / "ledger").by_outcome == {"discarded": seen["requests_billed"]}
    assert not read_records(tmp_path / "run" / "journal")
    key_file.unlink()
    leaks = [
        path for path in tmp_path.rglob("*") if path.is_file() and SECRET in path.read_text(errors="replace")
    ]
    assert not leaks and SECRET not in json.dumps(summary.to_json())


@pytest.mark.parametrize("when", ["at_the_end", pytest.param("at_the_next_start", marks=pytest.mark.slow)])
def test_stored_content_of_cut_answers_is_journaled_and_not_bought_again(tmp_path: Path, when: str) -> None:
    """Every stream is cut and the provider bills each whole answer; the account stores content. Each
    prompt's answer is rebuilt from `/generation/content`, flagged, and not bought again, except the one
    whose prompt offers tools (stored content holds no tool calls): that one is charged and bought again."""
    prompts = [*PROMPTS[:4], {**PROMPTS[4], "tools": TOOLS}]
    faults = [{"fault": "cutoff", "probability": 1.0, "after_tokens": 2}]
    delay = ["--generation-delay-s", str(DELAY_S)] if when == "at_the_next_start" else []
    wait = {"recovery_wait_s": 0.1} if when == "at_the_next_start" else {}
    with emulator(tmp_path / "emulator", faults, "--store-content", *delay) as url:
        first = generate(url, tmp_path, prompts=prompts, max_attempts=1, **wait)
        if when == "at_the_next_start":
            assert first.done == 0 and first.unresolved == len(prompts)
            time.sleep(DELAY_S + 0.1)
        second = generate(url, tmp_path, prompts=prompts, max_attempts=1)
        records = journaled_once(tmp_path)
        contents = {
            record["generation_id"]: httpx.get(
                f"{url}/generation/content", params={"id": record["generation_id"]}
            )
            for record in records.values()
        }
        seen = stats(url)
        assert_ledger_equals_charges(url, tmp_path)
    assert sorted(records) == ["p0", "p1", "p2", "p3"]
    assert seen["requests_received"] == len(prompts) + 1  # the prompt with tools, bought again
    outcomes = read_ledger(tmp_path / "ledger").by_outcome
    assert outcomes == {"recovered_content": 4, "recovered": 2}
    assert second.failed_transient == 1 and second.failures[0]["prompt_id"] == "p4"
    for record in records.values():
        content = contents[record["generation_id"]].json()
        validate("generation_content", content)
        assert record["recovered_content"] is True and record["attempts"] is None
        assert record["response"]["content"] == content["data"]["output"]["completion"] != ""
        assert record["response"]["finish_reason"] in ("stop", "length") and record["usage"]["cost"] > 0
        reply = parse_reply(record, "responses.jsonl")  # the token stage reads it as any answer
        assert reply.content == record["response"]["content"] and reply.tool_calls == ()


@pytest.mark.parametrize("key_limited", [True, False])
def test_the_first_wave_is_sized_to_what_the_key_can_reserve(tmp_path: Path, key_limited: bool) -> None:
    """The in-flight budget holds three requests' reservations. Told so by `/key`, the client starts three
    at a time and meets no in-flight-budget 402; not told (no key limit), it starts all six and meets them."""
    prompts = PROMPTS[:6]
    per_request = 64 * 2e-6 + 4e-7 * prompt_tokens_bound(prompts[0])  # Chutes' prices at max_tokens 64
    budget = f"{3.5 * per_request:.8f}"
    limits = ["--in-flight-budget", budget, *(["--key-limit", budget] if key_limited else [])]
    with emulator(tmp_path / "emulator", [], "--latency-s", "0.5", *limits) as url:
        summary = generate(
            url,
            tmp_path,
            prompts=prompts,
            concurrency=6,
            expected_request_usd=64 * 2e-6,
            prompt_usd_per_token=4e-7,
        )
        assert_ledger_equals_charges(url, tmp_path)
    assert summary.ended_because == "all_done" and summary.done == len(prompts)
    in_flight_402s = summary.errors_by_class.get("in_flight_budget", 0)
    if key_limited:
        assert summary.first_wave == 3 and in_flight_402s == 0
        assert summary.concurrency_cuts == 0 and summary.concurrency_lowest == 6  # a first wave is no cut
    else:
        assert summary.first_wave is None and in_flight_402s > 0


def test_a_provider_s_speed_counts_only_answers_whose_time_is_known() -> None:
    """An answer rebuilt from stored content has no request time: its tokens count in the dollars per
    million, not in tokens per second."""
    stats = ProviderStats()
    for latency_s in (2.0, None):
        usage = {"completion_tokens": 100, "cost": 0.001}
        stats.add_response(
            {"usage": usage, "response": {"content": "x", "finish_reason": "stop"}, "latency_s": latency_s}
        )
    row = stats.row()
    assert row["tok_s"] == 50.0 and row["usd_per_m_tokens"] == 10.0
