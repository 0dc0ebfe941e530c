"""The run-wide ledger and its parts: group-committed appends shared by processes, the incremental view,
heartbeats, the budget estimators and the adaptive concurrency."""

from __future__ import annotations

import json
import multiprocessing
import os
import random
import time
from pathlib import Path
from types import SimpleNamespace

import anyio
import pytest

from eaglepipe.openrouter import budget
from eaglepipe.openrouter.appendlog import AppendLog, read_lines
from eaglepipe.openrouter.budget import (
    FIT_ERRORS,
    MIN_OBSERVATIONS,
    REFIT_EVERY_S,
    REFIT_EVERY_TOKENS,
    SAFETY_SIGMAS,
    Forecast,
)
from eaglepipe.openrouter.concurrency import AdaptiveLimit
from eaglepipe.openrouter.errors import OpenRouterError
from eaglepipe.openrouter.ledger import HEARTBEAT_STALE_S, Heartbeat, LedgerView, RunLedger, ledger_path


def append_many(path: Path, writer: str, count: int) -> None:
    async def write() -> None:
        async with AppendLog(path, shared=True) as log, anyio.create_task_group() as group:
            for number in range(count):
                group.start_soon(log.append, {"writer": writer, "n": number, "pad": "x" * 500})

    anyio.run(write)


def test_processes_appending_at_once_never_interleave(tmp_path: Path) -> None:
    path = tmp_path / "ledger.jsonl"
    context = multiprocessing.get_context("spawn")
    writers = [context.Process(target=append_many, args=(path, name, 300)) for name in "abc"]
    for process in writers:
        process.start()
    for process in writers:
        process.join(60)
        assert process.exitcode == 0
    records = read_lines(path)  # every line parses: no interleaved bytes
    assert len(records) == 900
    for name in "abc":
        assert sorted(r["n"] for r in records if r["writer"] == name) == list(range(300))


def test_lines_written_behind_keep_their_order_and_are_on_disk_by_the_next_append(tmp_path: Path) -> None:
    path = tmp_path / "log.jsonl"

    async def write() -> None:
        async with AppendLog(path) as log:
            await log.append({"n": 0})
            log.append_behind({"n": 1})
            log.append_behind({"n": 2})
            await log.append({"n": 3})
            assert [record["n"] for record in read_lines(path)] == [0, 1, 2, 3]
            log.append_behind({"n": 4})

    anyio.run(write)
    assert [record["n"] for record in read_lines(path)] == [0, 1, 2, 3, 4]  # the close writes the last


def test_a_failed_write_fails_the_waiting_append_with_what_to_do(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def full(fd: int) -> None:
        raise OSError(28, "No space left on device")

    async def write() -> None:
        async with AppendLog(tmp_path / "log.jsonl") as log:
            monkeypatch.setattr(os, "fsync", full)
            with pytest.raises(
                OpenRouterError, match=r"log.jsonl \(No space left on device\): free disk space"
            ):
                await log.append({"n": 0})
            monkeypatch.undo()

    anyio.run(write)


def test_view_reads_each_line_once_and_tracks_unresolved(tmp_path: Path) -> None:
    async def write() -> None:
        async with RunLedger(tmp_path, "A") as ledger:
            await ledger.started("p1", "g1")
            await ledger.started("p2", "g2")
            await ledger.billed("p1", "g1", usd=0.5, outcome="kept")
            view = ledger.view.refresh()
            assert view.usd == 0.5 and list(view.unresolved) == ["g2"]
            await ledger.billed("p3", "g3", usd=0.25, outcome="discarded")
            assert ledger.view.refresh().usd == 0.75

    anyio.run(write)
    view = LedgerView(ledger_path(tmp_path)).refresh()
    assert view.usd == 0.75 and view.by_outcome == {"kept": 1, "discarded": 1}
    assert [r["prompt_id"] for r in view.unresolved_of("A")] == ["p2"] and view.unresolved_of("B") == []
    assert view.unresolved_count_of("A", excluding=set()) == 1
    assert view.unresolved_count_of("A", excluding={"g2", "g9"}) == view.unresolved_count_of("B", set()) == 0
    with open(ledger_path(tmp_path), "a") as handle:  # a writer killed mid-line
        handle.write('{"event": "billed", "usd": 100')
    assert view.refresh().usd == 0.75


def test_heartbeats_of_live_jobs_count_and_dead_ones_do_not(tmp_path: Path) -> None:
    mine, other = Heartbeat(tmp_path, "A"), Heartbeat(tmp_path, "B")
    other.beat(in_flight=7, expected_usd_in_flight=1.5)
    mine.beat(in_flight=3, expected_usd_in_flight=9.0)
    seen = mine.others()
    assert (seen.count, seen.in_flight, seen.expected_usd_in_flight) == (1, 7, 1.5)
    state = json.loads(other.path.read_text())
    other.path.write_text(json.dumps({**state, "updated_at": time.time() - HEARTBEAT_STALE_S - 1}))
    assert mine.others().count == 0
    dead = context_pid_that_exited()
    other.path.write_text(json.dumps({**state, "pid": dead, "updated_at": time.time()}))
    assert mine.others().count == 0
    other.remove()
    assert not other.path.exists()


def context_pid_that_exited() -> int:
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
    return pid


def test_forecast_is_the_upper_bound_until_answers_are_seen() -> None:
    forecast = Forecast(max_tokens=1000, upper_bound_usd=0.01)
    for _ in range(MIN_OBSERVATIONS - 1):
        forecast.observe(100, 0.001, 1.0)
    forecast.admit("a")
    forecast.refresh()
    assert forecast.committed_tokens() == 2000 and forecast.committed_usd() == pytest.approx(0.02)


def test_requests_in_flight_are_censored_so_long_runners_are_forecast_long(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = SimpleNamespace(now=100.0)
    monkeypatch.setattr(budget, "time", SimpleNamespace(monotonic=lambda: clock.now))
    forecast = Forecast(max_tokens=1000, upper_bound_usd=0.01)
    for _ in range(10):  # 100 tokens/s, no first-token delay: latency = tokens / 100
        forecast.observe(50, 0.0005, 0.5)
        forecast.observe(150, 0.0015, 1.5)
    forecast.refresh()
    # 20 answers and the pseudo-answer at the cap.
    assert forecast.mean_tokens == pytest.approx((10 * 50 + 10 * 150 + 1000) / 21)
    assert forecast.usd_per_token == pytest.approx(1e-5)
    for key in "abcde":  # five requests running 2 s: about 200 tokens each, beyond every finished one
        forecast.admit(key)
    clock.now += 2.0
    forecast.refresh()
    # Kaplan-Meier: 10 of 26 at risk end at 50, 10 of the 16 left at 150; the rest is at the cap.
    masses = {50: 10 / 26, 150: 10 / 26, 1000: 6 / 26}
    assert forecast.mean_tokens == pytest.approx(sum(v * m for v, m in masses.items()))
    assert forecast.in_flight_tokens == pytest.approx(5 * 1000)
    assert forecast.in_flight_variance == pytest.approx(0, abs=1e-6)
    fresh_variance = sum(v * v * m for v, m in masses.items()) - forecast.mean_tokens**2
    fresh_fit_error = (fresh_variance / 21) ** 0.5  # the fresh mean rests on all 21 answers
    expected = (
        5 * 1000 + forecast.mean_tokens + SAFETY_SIGMAS * fresh_variance**0.5 + FIT_ERRORS * fresh_fit_error
    )
    assert forecast.committed_tokens() == pytest.approx(expected)
    assert forecast.committed_usd() == pytest.approx(expected * 1e-5)
    forecast.finish("a")
    assert forecast.in_flight_tokens == pytest.approx(4 * 1000)


def test_forecast_beyond_a_bound_follows_the_observed_tail() -> None:
    forecast = Forecast(max_tokens=1000, upper_bound_usd=0.01)
    for length in [10] * 10 + [100] * 10 + [500] * 10:
        forecast.observe(length, 0.0, None)
    forecast.refresh()
    assert forecast.mean_tokens == pytest.approx((100 + 1000 + 5000 + 1000) / 31)
    beyond_50 = forecast.beyond(50)  # 10 at 100, 10 at 500, the pseudo-answer at 1000
    mean = (1000 + 5000 + 1000) / 21
    variance = (10 * 100**2 + 10 * 500**2 + 1000**2) / 21 - mean**2
    assert beyond_50.mean == pytest.approx(mean) and beyond_50.variance == pytest.approx(variance)
    assert beyond_50.fit_error == pytest.approx((variance / 21) ** 0.5)
    assert forecast.beyond(200).mean == pytest.approx((5000 + 1000) / 11)
    assert forecast.beyond(600).mean == 1000 and forecast.beyond(600).variance == 0


def kaplan_meier(events: list[float], censored: list[float], cap: float) -> dict[float, float]:
    """The estimator from its definition, one point at a time: {value: mass}, the rest at `cap`."""
    survival, masses = 1.0, {}
    for value in sorted(set(events)):
        at_risk = sum(point >= value for point in events + censored)
        drop = survival * events.count(value) / at_risk
        masses[value] = drop
        survival -= drop
    masses[cap] = masses.get(cap, 0.0) + survival
    return masses


def test_forecast_matches_kaplan_meier_with_ties_and_censored_points_on_events(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = SimpleNamespace(now=1000.0)
    monkeypatch.setattr(budget, "time", SimpleNamespace(monotonic=lambda: clock.now))
    rng = random.Random(7)
    forecast = Forecast(max_tokens=400, upper_bound_usd=0.01)
    events = [float(rng.choice([0, 20, 50, 50, 90, 130, 200, 200, 200, 310, 400])) for _ in range(60)]
    for length in events:
        forecast.observe(int(length), 0.0, length / 10)  # 10 tokens a second, no first-token wait
    # In flight 2.5 s: about 25 tokens so far. Ties that float rounding keeps exact: a request just sent
    # is censored at 0, on the empty answers; those past 40 s at the cap, on the answers cut there.
    elapsed = [rng.choice([0.0, 2.5, 5.5, 9.5, 13.5, 20.5, 35.5, 45.0, 60.0]) for _ in range(40)]
    for number, seconds in enumerate(elapsed):
        clock.now = 1000.0 - seconds
        forecast.admit(str(number))
    clock.now = 1000.0
    forecast.refresh()

    censored = [min(seconds * 10, 400) for seconds in elapsed]
    masses = kaplan_meier(events + [400.0], censored, cap=400.0)  # with the pseudo-answer at the cap

    def beyond(bound: float) -> float:
        tail = {value: mass for value, mass in masses.items() if value > bound}
        return max(bound, sum(v * m for v, m in tail.items()) / sum(tail.values())) if tail else 400.0

    assert forecast.mean_tokens == pytest.approx(sum(v * m for v, m in masses.items()), rel=1e-6)
    for bound in (0.0, 50.0, 75.0, 200.0, 399.0):
        assert forecast.beyond(bound).mean == pytest.approx(beyond(bound), rel=1e-6), bound
    assert forecast.in_flight_tokens == pytest.approx(sum(beyond(c) for c in censored), rel=1e-6)


def test_an_answer_that_outran_the_requests_started_with_it_leaves_their_tail_open(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Speeds vary: a fast answer can be longer than the elapsed-time estimate of every request still in
    flight. Kaplan-Meier alone then ends the distribution at that answer, and forecasts every request in
    flight to end about now; the pseudo-answer at the cap keeps their tail open."""
    clock = SimpleNamespace(now=97.0)
    monkeypatch.setattr(budget, "time", SimpleNamespace(monotonic=lambda: clock.now))
    forecast = Forecast(max_tokens=1000, upper_bound_usd=0.01)
    for length in range(10, 310, 10):
        forecast.observe(length, 0.0, length / 100)  # 100 tokens a second
    forecast.observe(320, 0.0, 2.9)  # a fast one
    for key in "abc":  # three requests sent 3 s ago: about 300 tokens so far by the fit
        forecast.admit(key)
    clock.now += 3.0
    forecast.refresh()
    longest = 320
    assert forecast.in_flight_tokens / 3 > longest + 100  # each alike: they started together


def test_the_forecast_is_refit_once_requests_in_flight_produced_a_few_tokens(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A fit at most REFIT_EVERY_S old is stale when answers run fast: the requests that survived it are
    forecast from tokens they have long passed."""
    clock = SimpleNamespace(now=100.0)
    monkeypatch.setattr(budget, "time", SimpleNamespace(monotonic=lambda: clock.now))
    forecast = Forecast(max_tokens=1000, upper_bound_usd=0.01)
    for length in range(10, 410, 10):
        forecast.observe(length, 0.0, length / 400)  # 400 tokens a second
    forecast.admit("a")
    forecast.refresh()
    fitted = forecast.in_flight_tokens
    few_tokens_s = REFIT_EVERY_TOKENS / 400
    assert few_tokens_s < REFIT_EVERY_S
    clock.now += few_tokens_s / 2
    forecast.refresh(max_age_s=REFIT_EVERY_S)
    assert forecast.in_flight_tokens == fitted  # not yet
    clock.now += few_tokens_s
    forecast.refresh(max_age_s=REFIT_EVERY_S)
    assert forecast.in_flight_tokens > fitted


def test_finished_requests_leave_the_forecast_and_their_rows_are_reused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Rows of finished requests are reused as the table grows: only the requests still in flight, each
    from its own start, count in a refit; a key admitted again replaces its request."""
    clock = SimpleNamespace(now=100.0)
    monkeypatch.setattr(budget, "time", SimpleNamespace(monotonic=lambda: clock.now))
    forecast = Forecast(max_tokens=1000, upper_bound_usd=0.01)
    for length in range(10, 1010, 10):
        forecast.observe(length, 0.0, length / 100)  # 100 tokens a second
    started = {}
    for number in range(150):  # past the first rows' 64: the table grows twice
        clock.now = 100.0 + number * 0.01
        forecast.admit(f"p{number}")
        started[f"p{number}"] = clock.now
    for number in range(0, 150, 3):
        forecast.finish(f"p{number}")
        del started[f"p{number}"]
    for number in (1, 2, 150, 151):  # two again, two new: into the rows just freed
        forecast.admit(f"p{number}")
        started[f"p{number}"] = clock.now
    clock.now = 104.0
    forecast.refresh()
    assert forecast.in_flight == len(started) == 102
    expected = sum(forecast.beyond((clock.now - at) * 100).mean for at in started.values())
    assert forecast.in_flight_tokens == pytest.approx(expected, rel=1e-9)


def test_forecast_takes_odd_lengths_a_provider_reports_and_lengths_past_the_cap() -> None:
    forecast = Forecast(max_tokens=100, upper_bound_usd=0.01)
    for length in [12.0, -1, 250, 50] * 5:
        forecast.observe(length, 0.0, None)  # type: ignore[arg-type]
    forecast.refresh()
    assert forecast.mean_tokens == pytest.approx((5 * (12 + 0 + 250 + 50) + 100) / 21)
    assert forecast.beyond(100).mean == 250


def test_adaptive_limit_cuts_under_a_429_storm_and_recovers_after() -> None:
    limit = AdaptiveLimit(1000)
    for _ in range(100):
        limit.record(rate_limited=False)
    limit.record(rate_limited=True)  # one 429 among many successes is no storm
    limit.tick()
    assert limit.current == 1000
    for _ in range(3):
        for _ in range(50):
            limit.record(rate_limited=True)
        limit.tick()
    assert limit.current == int(1000 * 0.7**3) and limit.cuts == 3 and limit.lowest == limit.current
    for _ in range(40):
        limit.tick()
    assert limit.current == 1000
    limit.set_ceiling(400)
    assert limit.current == 400
