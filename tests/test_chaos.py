"""A small chaos rehearsal (tests/support/chaos.py; bench/chaos.py runs it at 2000 in flight): a mix of the
failure taxonomy's shapes at rates far above the real run's, run to the end through the real client."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.chaos import run_chaos, shape_mix

from eaglepipe.openrouter.taxonomy import shape_named

FAST = ["--seed", "4", "--fault-seed", "4", "--mean-tokens", "40", "--length-sigma", "0.6",
        "--tokens-per-s", "200", "--latency-s", "0.05", "--tokens-per-event", "8"]


def test_every_prompt_is_bought_once_through_a_storm_of_documented_failures(tmp_path: Path) -> None:
    result = run_chaos(
        tmp_path,
        prompts=300,
        concurrency=120,
        faults=shape_mix(unusable_after_s=1.0, burst_every_s=5.0),
        emulator_args=FAST,
        max_tokens=400,
    )
    summary = result.summary
    assert summary.ended_because == "all_done", summary.message
    assert (result.answered_once, result.bought_twice, result.unanswered) == (300, [], [])
    # Throttling in bursts was met, waited out and never held against a provider.
    assert summary.errors_by_class["provider_rate_limited"] > 0
    throttles = {name for name in summary.errors_by_class if shape_named(name).verdict == "throttle"}
    assert not throttles & {reason for reasons in summary.breaker["strikes"].values() for reason in reasons}
    # Chutes went bad and was dropped; Moonshot AI answered from then on.
    assert set(summary.breaker["dropped"]) == {"Chutes"}
    assert "error_in_200_uncoded" in summary.breaker["dropped"]["Chutes"]
    # Every dollar the emulator charged is in the ledger; what was not kept is named by its cause.
    assert result.usd_ledger == pytest.approx(result.usd_charged, rel=1e-6)
    assert result.usd_kept + sum(result.usd_not_kept_by_cause.values()) == pytest.approx(result.usd_ledger)
    assert all(not cause.endswith("no cause recorded") for cause in result.usd_not_kept_by_cause)
