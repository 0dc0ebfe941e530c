"""CPU of one refit of the generation budget's forecast (`eaglepipe.openrouter.budget.Forecast.refresh`),
by answers finished so far, with 2000 requests in flight, against another checkout's forecast.

Why: admissions refit the forecast up to every `REFIT_EVERY_S` and the progress tick once a second, so at
the seeds' scale (2000 in flight, ~18 answers a second, thousands of answers per set) the refit runs
about five times a second over every answer so far. Its cost per answer of the run is
refits per second x CPU per refit / answers per second: the last column, at five refits and 18 answers a
second.

    python bench/forecast_refit.py --previous-tree /tmp/ep-prev   # e.g. git worktree add /tmp/ep-prev REV

Lengths are log-normal (median 1100 tokens, capped at 16384); each request in flight started up to 120 s
ago. Every case is timed in this process with `time.process_time`, the fastest of `--repeats` kept.
"""

from __future__ import annotations

import argparse
import importlib.util
import random
import sys
import time
from pathlib import Path
from types import ModuleType, SimpleNamespace

MAX_TOKENS = 16384
IN_FLIGHT = 2000
ANSWERS = (1_000, 10_000, 50_000)
REFITS_PER_S, ANSWERS_PER_S = 5, 18


def load_budget(tree: Path) -> ModuleType:
    """`eaglepipe/openrouter/budget.py` of a checkout, imported under its own name."""
    path = tree / "eaglepipe" / "openrouter" / "budget.py"
    spec = importlib.util.spec_from_file_location(f"budget_{abs(hash(str(tree)))}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def ms_per_refit(budget: ModuleType, answers: int, refits: int) -> float:
    rng = random.Random(answers)
    forecast = budget.Forecast(MAX_TOKENS, 0.05)
    for _ in range(answers):
        tokens = min(int(rng.lognormvariate(7.0, 0.8)), MAX_TOKENS)
        forecast.observe(tokens, tokens * 3e-6, 0.5 + tokens / 15)
    now = time.monotonic()
    for number in range(IN_FLIGHT):  # sent over the last two minutes: the module's clock says when
        sent = now - rng.uniform(0, 120)
        budget.time = SimpleNamespace(monotonic=lambda sent=sent: sent)
        forecast.admit(f"p{number}")
    budget.time = time
    forecast.refresh()  # once untimed: numpy's first calls in the process cost more
    started = time.process_time()
    for _ in range(refits):
        forecast.refresh()
        forecast.observe(1100, 0.0033, 74.0)  # one more answer between refits, as in a run
    return (time.process_time() - started) / refits * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--previous-tree", type=Path, action="append", default=[])
    parser.add_argument("--refits", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    trees = [("this tree", Path(__file__).resolve().parents[1])]
    trees += [(f"previous ({tree})", tree) for tree in args.previous_tree]
    budgets = {name: load_budget(tree) for name, tree in trees}
    # Each case timed `--repeats` times, the trees taking turns, and the fastest kept: the first cases
    # timed in a process read high, and a shared machine only ever adds time.
    best: dict[tuple[str, int], float] = {}
    for _ in range(args.repeats):
        for answers in ANSWERS:
            for name, budget in budgets.items():
                ms = ms_per_refit(budget, answers, args.refits)
                best[name, answers] = min(ms, best.get((name, answers), ms))
    print(f"{'forecast':<40} {'answers':>8} {'ms/refit':>9} {'ms/answer of the run':>21}")
    for name, _tree in trees:
        for answers in ANSWERS:
            ms = best[name, answers]
            print(f"{name:<40} {answers:>8} {ms:>9.2f} {ms * REFITS_PER_S / ANSWERS_PER_S:>21.2f}")


if __name__ == "__main__":
    main()
