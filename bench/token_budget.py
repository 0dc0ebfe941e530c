"""Where a set ends against its output-token budget: the generation client's admission rule over the budget
forecast (`eaglepipe.openrouter.budget.Forecast`), in virtual time, many runs per shape, against another
checkout's forecast.

Why: a real or emulated run takes seconds to minutes and its overshoot varies from run to run, so one
rehearsal passing says little. Here each run draws its own lengths and speeds, and the table gives the
spread of `completion tokens / budget` at the end: what `tests/test_generation_rehearsal.py`'s heavy-tailed
run (at most 1% over) samples once.

    python bench/token_budget.py --previous-tree /tmp/ep-prev   # e.g. git worktree add /tmp/ep-prev REV

The admission rule is the client's (`Admission.try_start` and `Admission._budget_verdict` in
eaglepipe/openrouter/admission.py, token budget only): while fewer than `concurrency` are in flight, refresh
the forecast (at most every `REFIT_EVERY_S`, as the client asks) and admit while completion tokens done +
`committed_tokens()` stay under the budget; stop once nothing is in flight and one more would not fit; the
tick every `TICK_S` refits it too once it is that old. Answers are log-normal lengths (`+1` for the stop
token, cut at max_tokens) that take `latency + tokens / rate` seconds, times exp(N(0, speed spread)):
requests of one provider do not all run at one speed.
"""

from __future__ import annotations

import argparse
import heapq
import math
import random
import statistics
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType, SimpleNamespace

from forecast_refit import load_budget

from eaglepipe.openrouter.client import TICK_S


@dataclass(frozen=True)
class Shape:
    name: str
    budget: int
    concurrency: int
    max_tokens: int
    mean_tokens: float
    sigma: float
    tokens_per_s: float
    latency_s: float


SHAPES = {
    # tests/test_generation_rehearsal.py's heavy-tailed run: the whole budget in about 3 turns of the
    # requests in flight, so the end is decided while half of it is still in flight.
    "rehearsal": Shape("rehearsal", 150_000, 200, 1500, 250, 1.2, 400, 0.05),
    # The real config against the seeds' answers (docs/generation.md): 10M tokens, 2000 in flight.
    "seeds": Shape("seeds", 10_000_000, 2000, 16384, 1700, 1.0, 15, 1.0),
}


class VirtualClock:
    def __init__(self) -> None:
        self.now = 0.0

    def monotonic(self) -> float:
        return self.now


def one_run(
    budget: ModuleType, clock: VirtualClock, shape: Shape, spread: float, seed: int
) -> tuple[float, float]:
    """(completion tokens / budget, seconds) where the run ends."""
    rng = random.Random(seed)
    mu = math.log(shape.mean_tokens) - shape.sigma**2 / 2
    clock.now = 0.0
    forecast = budget.Forecast(shape.max_tokens, 1.0)
    done = in_flight = admitted = 0
    ends: list[tuple[float, int, int, float]] = []  # (end, request, tokens, start)
    next_tick = TICK_S
    while True:
        while in_flight < shape.concurrency:
            forecast.refresh(max_age_s=budget.REFIT_EVERY_S)
            if done + forecast.committed_tokens() > shape.budget:
                break
            words = max(1, round(rng.lognormvariate(mu, shape.sigma)))
            tokens = min(words + 1, shape.max_tokens)
            seconds = (shape.latency_s + tokens / shape.tokens_per_s) * math.exp(rng.gauss(0, spread))
            forecast.admit(str(admitted))
            heapq.heappush(ends, (clock.now + seconds, admitted, tokens, clock.now))
            admitted += 1
            in_flight += 1
        if not ends:
            return done / shape.budget, clock.now
        if ends[0][0] <= next_tick:
            end, request, tokens, start = heapq.heappop(ends)
            clock.now = end
            in_flight -= 1
            forecast.finish(str(request))
            done += tokens
            forecast.observe(tokens, tokens * 3e-6, end - start)
        else:
            clock.now = next_tick
            next_tick += TICK_S
            forecast.refresh(max_age_s=budget.REFIT_EVERY_S)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--previous-tree", type=Path, action="append", default=[])
    parser.add_argument("--runs", type=int, default=200, help="runs per row of the rehearsal shape")
    parser.add_argument("--seeds-runs", type=int, default=8, help="runs per row of the seeds shape")
    args = parser.parse_args()
    trees = [("this tree", Path(__file__).resolve().parents[1])]
    trees += [(f"previous ({tree.name})", tree) for tree in args.previous_tree]
    rows = [("rehearsal", spread, args.runs) for spread in (0.0, 0.05, 0.3)]
    rows += [("seeds", 0.3, args.seeds_runs)]
    print(
        f"{'forecast':<28} {'shape':<10} {'speed spread':>12} {'runs':>5} {'p5':>7} {'median':>7} "
        f"{'p95':>7} {'max':>7} {'over 1%':>8} {'median s':>9}"
    )
    for name, tree in trees:
        budget = load_budget(tree)
        clock = VirtualClock()
        budget.time = SimpleNamespace(monotonic=clock.monotonic)
        for shape_name, spread, runs in rows:
            results = [one_run(budget, clock, SHAPES[shape_name], spread, seed) for seed in range(runs)]
            ends = sorted(end for end, _ in results)
            seconds = statistics.median(seconds for _, seconds in results)
            over = sum(end > 1.01 for end in ends)
            p5, median, p95 = ends[len(ends) // 20], statistics.median(ends), ends[len(ends) * 19 // 20]
            print(
                f"{name:<28} {shape_name:<10} {spread:>12} {runs:>5} {p5:>7.4f} {median:>7.4f} "
                f"{p95:>7.4f} {ends[-1]:>7.4f} {over / runs:>8.1%} {seconds:>9.0f}",
                flush=True,
            )


if __name__ == "__main__":
    main()
