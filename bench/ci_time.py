"""What CI costs, and where: `.ci/run` on a fresh clone of this checkout's HEAD, timed, then the ten slowest
tests and each tier's total from the durations pytest prints into CI's log.

    python3 bench/ci_time.py [--keep DIR]       # clone, run .ci/run, report (about 30 minutes)
    python3 bench/ci_time.py --log FILE         # report on a log a run already left (this checkout's tiers)

CI's limit is 90 minutes and a run past it does not land, however green; the tests' own budgets
(tests/budget.py) catch one test growing, this catches the sum. A test's time is its setup, call and
teardown as pytest reports them, so the test that set up a shared fixture (a tiny target, a vLLM engine)
carries its cost. Each test counts in one tier, the first of its marks in TIERS (else `other`), so the
tiers add up to the tests' total; under xdist workers they overlap, so that total can exceed the wall time.
Run it on an otherwise idle machine (or say what ran beside it): every figure is one run's wall time.
pip's download cache is not cleared: the installs fetch what it lacks.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

from newcomer import clean_env

REPO = Path(__file__).resolve().parent.parent
TIERS = ("slurm", "cluster", "vllm", "sglang", "slow")
DURATION = re.compile(r"^(\d+(?:\.\d+)?)s (setup|call|teardown)\s+(\S.*?)\s*$", re.M)
# Each collected test's marks, as {nodeid: [names]}: pytest run in the checkout, by its own interpreter.
COLLECT = """
import json, sys
import pytest

class Marks:
    def pytest_collection_finish(self, session):
        marks = {item.nodeid: sorted({m.name for m in item.iter_markers()}) for item in session.items}
        with open(sys.argv[1], "w") as out:
            json.dump(marks, out)

sys.exit(pytest.main(["--collect-only", "-q", "-p", "no:cacheprovider"], plugins=[Marks()]))
"""


def durations(log: str) -> dict[str, dict[str, float]]:
    """{nodeid: {phase: seconds}} from pytest's --durations table."""
    if "slowest durations" not in log:
        sys.exit("the log holds no pytest durations table (make test runs pytest with --durations=0)")
    table = log[log.index("slowest durations") :]
    found: dict[str, dict[str, float]] = defaultdict(dict)
    for seconds, phase, nodeid in DURATION.findall(table):
        found[nodeid][phase] = float(seconds)
    return found


def tier_of(marks: list[str]) -> str:
    return next((tier for tier in TIERS if tier in marks), "other")


def test_marks(checkout: Path) -> dict[str, list[str]]:
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        run = subprocess.run([str(checkout / ".venv" / "bin" / "python"), "-c", COLLECT, out.name],
                             cwd=checkout, capture_output=True, text=True)
        if run.returncode != 0:
            sys.exit(f"collecting the tests' marks failed:\n{run.stdout[-2000:]}{run.stderr[-2000:]}")
        return json.loads(Path(out.name).read_text())


def report(log: str, marks: dict[str, list[str]]) -> None:
    tests = durations(log)
    totals = {nodeid: sum(phases.values()) for nodeid, phases in tests.items()}
    print("\nten slowest tests (setup + call + teardown; setup includes the shared fixtures it built):")
    for nodeid, seconds in sorted(totals.items(), key=lambda kv: -kv[1])[:10]:
        phases = tests[nodeid]
        split = f"setup {phases.get('setup', 0):.0f} s, call {phases.get('call', 0):.0f} s"
        print(f"  {seconds:7.1f} s  {nodeid}  ({split}; {tier_of(marks.get(nodeid, []))})")
    by_tier: dict[str, list[float]] = {tier: [] for tier in (*TIERS, "other")}
    for nodeid, seconds in totals.items():
        by_tier[tier_of(marks.get(nodeid, []))].append(seconds)
    print("\ntier totals (each test in the first of its marks among " + ", ".join(TIERS) + "):")
    for tier, times in by_tier.items():
        print(f"  {tier:8} {sum(times) / 60:7.1f} min  {len(times):4} tests")
    print(f"  {'all':8} {sum(totals.values()) / 60:7.1f} min  {len(totals):4} tests")
    if unknown := [nodeid for nodeid in tests if nodeid not in marks]:
        print(f"({len(unknown)} timed tests are not collected by this checkout: counted as 'other')")
    session = re.findall(r"=+ .*? in ([\d.]+)s(?: \([\d:]+\))? =+", log)
    if session:
        print(f"pytest's own wall time: {float(session[-1]) / 60:.1f} min")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keep", type=Path, help="clone here and keep it (default: a scratch folder)")
    parser.add_argument("--log", type=Path, help="report on this log instead of running CI")
    args = parser.parse_args()
    if args.log:
        report(args.log.read_text(errors="replace"), test_marks(REPO))
        return
    scratch = Path(tempfile.mkdtemp(prefix="eaglepipe-ci-"))
    clone = args.keep or scratch / "eaglepipe"
    subprocess.run(["git", "clone", "--quiet", str(REPO), str(clone)], check=True)
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=clone, capture_output=True, text=True)
    load = os.getloadavg()[0]
    print(f"fresh clone of {head.stdout.strip()} in {clone}, {time.strftime('%Y-%m-%d %H:%M')}, "
          f"{os.cpu_count()} CPUs, load average {load:.1f} at the start", flush=True)
    log = scratch / "ci.log"
    try:
        started = time.monotonic()
        with open(log, "w") as out:
            done = subprocess.run(["bash", ".ci/run"], cwd=clone, stdout=out, stderr=subprocess.STDOUT,
                                  env=clean_env())
        seconds = time.monotonic() - started
        print(f".ci/run: {seconds / 60:.1f} min, exit status {done.returncode} (log: {log})")
        report(log.read_text(errors="replace"), test_marks(clone))
    finally:
        if args.keep is None:
            shutil.rmtree(clone, ignore_errors=True)


if __name__ == "__main__":
    main()
