"""What a newcomer waits for, as the README's commands run on a fresh clone of this checkout's HEAD.

    python3 bench/newcomer.py [--steps install,demo,test-fast,test] [--keep DIR]

Clones HEAD into a scratch folder and times, one after another, `make install` (the venv, from the
package registries), `make demo` (the whole chain on the embedded default), `make test-fast` and, when
asked, `make test` (what CI runs: it builds .venv-vllm and .venv-sglang too). Prints one row per step:
its wall time, its exit status and, for the demo, Snakemake's job count. Run it on an otherwise idle
machine: every figure is one run's wall time, and the README quotes them as what a newcomer will see.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
STEPS = ("install", "demo", "test-fast", "test")


def clean_env() -> dict[str, str]:
    """This environment without an activated venv, which must not stand in for the clone's own."""
    env = {key: value for key, value in os.environ.items() if key != "VIRTUAL_ENV"}
    if venv := os.environ.get("VIRTUAL_ENV"):
        env["PATH"] = os.pathsep.join(p for p in env["PATH"].split(os.pathsep) if not p.startswith(venv))
    return env


def run_step(clone: Path, step: str, log: Path) -> tuple[float, int]:
    started = time.monotonic()
    with open(log, "w") as out:
        done = subprocess.run(["make", step], cwd=clone, stdout=out, stderr=subprocess.STDOUT,
                              env=clean_env())
    return time.monotonic() - started, done.returncode


def demo_jobs(log: Path) -> str:
    steps = re.findall(r"(\d+) of (\d+) steps", log.read_text())
    return f"{steps[-1][0]} of {steps[-1][1]} jobs" if steps else ""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", default="install,demo,test-fast")
    parser.add_argument("--keep", type=Path, help="clone here and keep it (default: a scratch folder)")
    args = parser.parse_args()
    steps = args.steps.split(",")
    if unknown := [step for step in steps if step not in STEPS]:
        sys.exit(f"--steps: unknown {unknown}; choose from {', '.join(STEPS)}")
    scratch = Path(tempfile.mkdtemp(prefix="eaglepipe-newcomer-"))
    clone = args.keep or scratch / "eaglepipe"
    subprocess.run(["git", "clone", "--quiet", str(REPO), str(clone)], check=True)
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=clone, capture_output=True, text=True)
    print(f"fresh clone of {head.stdout.strip()} in {clone}, {time.strftime('%Y-%m-%d %H:%M')}, "
          f"{os.cpu_count()} CPUs")
    print(f"{'step':12} {'wall':>10} {'status':>6}  notes")
    try:
        for step in steps:
            log = scratch / f"{step}.log"
            seconds, status = run_step(clone, step, log)
            notes = demo_jobs(log) if step == "demo" else ""
            print(f"make {step:7} {seconds / 60:7.1f} min {status:>6}  {notes}  (log: {log})", flush=True)
            if status != 0:
                break
    finally:
        if args.keep is None:
            shutil.rmtree(clone, ignore_errors=True)


if __name__ == "__main__":
    main()
