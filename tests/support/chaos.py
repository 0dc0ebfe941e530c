"""The chaos rehearsal: one set at full concurrency against the synthetic emulator answering a mix of the
failure taxonomy's shapes at realistic rates, run to the end, and what it bought measured from the
journal, the ledger and the emulator's own counters. `bench/chaos.py` runs it at 2000 in flight beside
the same run without faults; `tests/test_chaos.py` runs a small one.

The mix (per request; `SHAPE_MIX`): throttling in bursts (every request of one second in every twenty
answered "temporarily rate-limited upstream", about 5%), an account window closed once, about 1%
transient faults (a provider's 5xx, cut connections, some of them billed in full as a provider that
cannot cancel bills them, errors mid-stream, 503s), Chutes going unusable
halfway (from `unusable_after_s` on, half of its answers are errors inside an HTTP 200 that name no
code, which the breaker drops it for), and a few percent of odd but whole answers (finish reasons said
only natively, in the provider's own words or not at all, trailing chunks, keep-alive stalls, answers
without usage or cost) and answers from a provider routing did not keep.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import httpx

from eaglepipe.openrouter.appendlog import read_lines
from eaglepipe.openrouter.client import GenerationSummary, generate_set
from eaglepipe.openrouter.journal import read_records
from eaglepipe.openrouter.ledger import ledger_path
from eaglepipe.prompts.records import PromptRecord
from support.emulator import running_emulator

MODEL = "moonshotai/kimi-k2.5"
KEPT = (("Chutes", "chutes/int4"), ("Moonshot AI", "moonshotai"))


def shape_mix(unusable_after_s: float, burst_every_s: float = 20.0) -> list[dict[str, Any]]:
    """The rules, in the emulator's faults format."""
    return [
        {"fault": "burst", "shape": "provider_rate_limited", "every_s": burst_every_s, "duration_s": 1.0},
        {"fault": "account_rate_limited", "times": 1, "after_s": unusable_after_s / 2},
        {
            "fault": "error_in_200_uncoded",
            "probability": 0.5,
            "provider": "Chutes",
            "after_s": unusable_after_s,
        },
        {"fault": "provider_server_error", "probability": 0.003},
        {"fault": "network", "probability": 0.002},
        {"fault": "network_midstream", "probability": 0.002},
        {"fault": "unfinished", "probability": 0.001},
        {"fault": "midstream_server_error", "probability": 0.002, "after_tokens": 8},
        {"fault": "unavailable", "probability": 0.002},
        {"fault": "capacity_exhausted", "probability": 0.005},
        {"fault": "finish_native_only", "probability": 0.02},
        {"fault": "finish_unnormalised", "probability": 0.01},
        {"fault": "finish_missing", "probability": 0.01},
        {"fault": "usage_after_finish", "probability": 0.01},
        {"fault": "duplicate_finish", "probability": 0.01},
        {"fault": "keepalive_comments", "probability": 0.005},
        {"fault": "usage_missing", "probability": 0.003},
        {"fault": "cost_null", "probability": 0.003},
        {"fault": "foreign_provider", "probability": 0.002},
    ]


@dataclass
class ChaosResult:
    prompts: int
    wall_s: float
    summary: GenerationSummary
    answered_once: int  # prompts with exactly one journaled answer and one kept ledger line
    bought_twice: list[str]  # prompts with more than one kept answer (must be none)
    unanswered: list[str]
    attempts: Counter[int]
    usd_charged: float  # the emulator's own total
    usd_ledger: float
    usd_kept: float
    usd_not_kept_by_cause: dict[str, float] = field(default_factory=dict)
    faults: dict[str, int] = field(default_factory=dict)


def run_chaos(
    folder: Path,
    *,
    prompts: int,
    concurrency: int,
    faults: list[dict[str, Any]] | None,
    emulator_args: list[str],
    max_tokens: int,
    stream: bool = True,
    request_timeout_s: float = 120.0,
) -> ChaosResult:
    """One set through the real client (`generate_set`, in this process) against a fresh synthetic
    emulator with `faults` (None: none), everything it bought and kept read back afterwards."""
    from stage_settings import generation_settings

    args = ["--model-id", MODEL, *emulator_args]
    folder.mkdir(parents=True, exist_ok=True)
    with running_emulator(None, extra_args=args, log_path=folder / "emulator.log") as url:
        if faults is not None:
            response = httpx.post(f"{url}/emulator/faults", json=faults)
            response.raise_for_status()
        settings = generation_settings(
            base_url=url,
            model=MODEL,
            fingerprint="chaos",
            max_tokens=max_tokens,
            concurrency=concurrency,
            stream=stream,
            progress=False,
            allowed_providers=tuple(name for name, _ in KEPT),
            endpoint_tags=KEPT,
            provider_obj={"only": [tag for _, tag in KEPT], "allow_fallbacks": False},
            recovery_wait_s=5.0,
            request_timeout_s=request_timeout_s,
        )
        batch: list[PromptRecord] = [
            {"id": f"p{i}", "messages": [{"role": "user", "content": f"Question {i}"}]}
            for i in range(prompts)
        ]

        async def generate() -> GenerationSummary:
            return await generate_set(
                batch,
                settings=settings,
                api_key=None,
                journal_dir=folder / "journal",
                ledger_dir=folder / "ledger",
                dataset="chaos",
            )

        started = time.monotonic()
        summary = anyio.run(generate)
        wall_s = time.monotonic() - started
        stats = httpx.get(f"{url}/emulator/stats").json()
    return _measured(folder, prompts, wall_s, summary, stats)


def _measured(
    folder: Path, prompts: int, wall_s: float, summary: GenerationSummary, stats: dict[str, Any]
) -> ChaosResult:
    """Kept is what the journal holds: a billed line whose generation id is a journaled answer's (priced
    at once, by `/generation` later, or rebuilt from stored content); every other billed dollar was not
    kept, and its line's outcome and cause say why."""
    records = read_records(folder / "journal")
    journaled = Counter(record["prompt_id"] for record in records)
    answers = {record.get("generation_id") for record in records}
    billed = [line for line in read_lines(ledger_path(folder / "ledger")) if line.get("event") == "billed"]
    kept_lines = Counter(line["prompt_id"] for line in billed if line.get("generation_id") in answers)
    usd_kept = 0.0
    not_kept: Counter[str] = Counter()
    for line in billed:
        if line.get("generation_id") in answers:
            usd_kept += line.get("usd") or 0.0
        elif line.get("usd"):
            not_kept[f"{line['outcome']}: {line.get('cause', 'no cause recorded')}"] += line["usd"]
    ids = [f"p{i}" for i in range(prompts)]
    return ChaosResult(
        prompts=prompts,
        wall_s=wall_s,
        summary=summary,
        answered_once=sum(journaled[p] == 1 and kept_lines[p] == 1 for p in ids),
        bought_twice=[p for p in ids if journaled[p] > 1 or kept_lines[p] > 1],
        unanswered=[p for p in ids if journaled[p] == 0],
        attempts=Counter(record.get("attempts") or 0 for record in records),
        usd_charged=stats["usd_charged"],
        usd_ledger=sum(line.get("usd") or 0.0 for line in billed),
        usd_kept=usd_kept,
        usd_not_kept_by_cause=dict(not_kept),
        faults=stats["faults"],
    )


def report(faulty: ChaosResult, calm: ChaosResult | None) -> str:
    """The rehearsal's figures, one per line."""
    s = faulty.summary
    attempts = sorted(faulty.attempts.elements())
    extra = faulty.usd_not_kept_by_cause
    lines = [
        f"prompts: {faulty.prompts}, answered exactly once: {faulty.answered_once}, "
        f"bought twice: {len(faulty.bought_twice)}, unanswered: {len(faulty.unanswered)}",
        f"ended: {s.ended_because}; retries {s.retries}; lowest concurrency {s.concurrency_lowest} "
        f"({s.concurrency_cuts} cuts)",
        f"dollars charged by the emulator ${faulty.usd_charged:.4f}, in the ledger ${faulty.usd_ledger:.4f}, "
        f"kept ${faulty.usd_kept:.4f} ({faulty.usd_kept / max(faulty.usd_ledger, 1e-12):.2%})",
        "dollars not kept, by ledger outcome and cause: "
        + (", ".join(f"{cause} ${usd:.4f}" for cause, usd in sorted(extra.items())) or "none"),
        "attempts per answer: "
        + (
            f"mean {sum(attempts) / len(attempts):.3f}, p99 {attempts[int(0.99 * (len(attempts) - 1))]}, "
            f"max {attempts[-1]}"
            if attempts
            else "none"
        ),
        "failures by class: " + ", ".join(f"{name}={n}" for name, n in sorted(s.errors_by_class.items())),
        f"breaker: dropped {s.breaker['dropped'] or 'none'}; strikes {s.breaker['strikes']}",
        "injected: " + ", ".join(f"{name}={n}" for name, n in sorted(faulty.faults.items())),
    ]
    if calm is not None:
        lines.append(
            f"wall time: {faulty.wall_s:.1f} s with faults, {calm.wall_s:.1f} s without: "
            f"{faulty.wall_s / calm.wall_s:.2f}x"
        )
    return "\n".join(lines)
