"""Progress of a job that runs for minutes (hidden states, training, evaluation): one line at a steady
interval with done/total, throughput and ETA, through the job's logger, so it reaches the job's log file and
the terminal alike, as generation's progress line does."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

# On a terminal generation's line is redrawn every tick; in a log file a plain line this often is enough.
PLAIN_LINE_EVERY_S = 30.0


def format_eta(seconds: float | None) -> str:
    if seconds is None:
        return "--"
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s"


def eta_seconds(elapsed: float, done: int, left: int, *, minimum: int = 1) -> float | None:
    """Time for `left` units at the pace of the `done` units this run finished in `elapsed` seconds; None
    until `minimum` are done. Work done in parallel finishes late and then all at once: the first few
    answers come at one request's latency, not at the run's throughput, and an ETA from them only climbs
    while the rest are still in flight."""
    if left <= 0:
        return 0.0
    if done < max(minimum, 1):
        return None
    return elapsed / done * left


class StepProgress:
    """Counts work done (`unit`: what `total` counts) and speed in `rate_unit` (tokens, usually)."""

    def __init__(
        self,
        log: logging.Logger,
        what: str,
        total: int,
        *,
        unit: str,
        rate_unit: str = "tokens",
        every_s: float = PLAIN_LINE_EVERY_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.log, self.what, self.total, self.unit, self.rate_unit = log, what, total, unit, rate_unit
        self.every_s, self.clock = every_s, clock
        self.done = 0
        self.computed = 0  # units done by this run, not reused from an earlier one: the ETA's basis
        self.counted = 0  # rate units processed by this run
        self.started = self.last_line = clock()

    def advance(self, done: int = 1, counted: int = 0, *, reused: bool = False) -> None:
        """`done` more units finished, `counted` rate units processed for them; reused work (a shard kept
        from an earlier run) moves done/total but not the speed or the ETA."""
        self.done += done
        self.computed += 0 if reused else done
        self.counted += counted
        now = self.clock()
        if now - self.last_line >= self.every_s or self.done >= self.total:
            self.last_line = now
            self.log.info("%s", self.line(now))

    def line(self, now: float | None = None) -> str:
        now = self.clock() if now is None else now
        elapsed = max(now - self.started, 1e-9)
        rate = self.counted / elapsed
        left = self.total - self.done
        eta = eta_seconds(elapsed, self.computed, left)
        share = f" ({100 * self.done / self.total:.0f}%)" if self.total else ""
        return (
            f"{self.what}: {self.done}/{self.total} {self.unit}{share}, "
            f"{rate:,.{1 if rate < 10 else 0}f} {self.rate_unit}/s, elapsed {format_eta(elapsed)}, "
            f"ETA {format_eta(eta)}"
        )
