"""How long `snakemake -n` takes for the real config, fresh and in the middle of a Kimi-sized run.

    python bench/dry_run.py [--prompts 20000] [--answered 5000] [--answer-kb 12] [--repeats 5]

Three work directories, each planned with the real `config.yaml` (no key, no network) `--repeats` times,
median wall time of the whole `snakemake -n` process:
- fresh: nothing built (a fresh clone);
- beside a demo: a finished embedded-default tree under results/demo (the real plan must not read it);
- mid-run: every set's prompts built (`--prompts` each) and `--answered` answers journaled per set, each
  `--answer-kb` kB like a Kimi-K2.5 answer with its reasoning: the first dry run tallies every journal,
  later ones read only what was appended since.
Then, in this process, the spend plan's journal reading for the mid-run tree: a full read of every journal
(`load_done`, what the plan did before) against the kept tally (`tally_done`), as a ratio.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from eaglepipe.config import validate_config
from eaglepipe.layout import RunLayout
from eaglepipe.openrouter.fingerprint import config_fingerprint
from eaglepipe.openrouter.journal import RECORDS_FILE, load_done, tally_done
from eaglepipe.openrouter.ledger import LEDGER_FILE

REPO = Path(__file__).resolve().parent.parent


def dry_run_seconds(workdir: Path, repeats: int) -> list[tuple[float, float]]:
    """(wall seconds, CPU seconds user + system) of each dry run: CPU time is the steadier figure on a
    busy machine, wall time what a user waits."""
    env = {k: v for k, v in os.environ.items() if k != "OPENROUTER_KEY_FILE"}
    env["HF_HUB_OFFLINE"] = "1"
    command = [sys.executable, "-m", "snakemake", "-n", "-s", str(REPO / "Snakefile"), "--directory",
               str(workdir), "--configfile", str(REPO / "config.yaml")]
    times = []
    for _ in range(repeats):
        before, start = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
        run = subprocess.run(command, capture_output=True, text=True, env=env)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        times.append((time.perf_counter() - start, cpu))
        if run.returncode != 0:
            sys.exit(f"dry run failed in {workdir}:\n{run.stderr[-2000:]}")
    return times


def fill_demo_tree(workdir: Path) -> None:
    """What `make demo` leaves that the real plan could trip on: a ledger with money, providers.json,
    journals and finished per-set files, a drafter."""
    demo = RunLayout.from_paths(workdir / "results" / "demo", workdir / "results" / "demo" / "prompts")
    demo.ledger.mkdir(parents=True)
    billed = {"event": "billed", "set": "demo-chat", "generation_id": "g", "usd": 0.0186, "outcome": "kept"}
    (demo.ledger / LEDGER_FILE).write_text(json.dumps(billed) + "\n")
    demo.providers.write_text(json.dumps({"model": "local/smollm2-135m-instruct", "kept": []}))
    for ds in ("demo-chat", "demo-code", "demo-math", "demo-multiturn", "demo-tools"):
        demo.journal(ds).mkdir(parents=True)
        (demo.journal(ds) / RECORDS_FILE).write_text(json.dumps({"prompt_id": "p"}) + "\n")
        for member in (demo.responses, demo.tokens, demo.token_stats, demo.hidden_done):
            member(ds).write_text("")
    demo.drafter.mkdir()
    for path in (demo.drafter_config, demo.drafter_weights, demo.evaluation):
        path.write_text("{}")


def fill_mid_run_tree(workdir: Path, prompts: int, answered: int, answer_kb: int, fingerprint: str) -> None:
    """Real-config sets B1..B8 with built prompt sets and partly written journals."""
    layout = real_layout(workdir)
    filler = "x" * (answer_kb * 1024)
    for ds in real_sets():
        ids = [hashlib.sha256(f"{ds}-{i}".encode()).hexdigest() for i in range(prompts)]
        layout.prompts.mkdir(parents=True, exist_ok=True)
        with open(layout.prompt_set(ds), "w") as handle:
            for pid in ids:
                message = {"role": "user", "content": f"Question {pid[:8]}: " + "explain " * 80}
                handle.write(json.dumps({"id": pid, "messages": [message]}) + "\n")
        layout.journal(ds).mkdir(parents=True)
        with open(layout.journal(ds) / RECORDS_FILE, "w") as handle:
            for pid in ids[:answered]:
                record = {"prompt_id": pid, "fingerprint": fingerprint,
                          "response": {"content": filler, "reasoning": filler[: len(filler) // 2]},
                          "usage": {"prompt_tokens": 300, "completion_tokens": 1700, "cost": 0.005}}
                handle.write(json.dumps(record) + "\n")


def real_sets() -> list[str]:
    return list(yaml.safe_load((REPO / "config.yaml").read_text())["datasets"])


def real_layout(workdir: Path) -> RunLayout:
    """Where the real config's run keeps its files when run in `workdir`."""
    paths = yaml.safe_load((REPO / "config.yaml").read_text())["paths"]
    return RunLayout.from_paths(workdir / paths["results"], workdir / paths["prompts"])


def real_fingerprint() -> str:
    """What the real config's generate rule journals under, so its plan reuses the answers written here."""
    config = yaml.safe_load((REPO / "config.yaml").read_text())
    return config_fingerprint(validate_config(config, REPO / "schemas" / "config.schema.yaml"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--prompts", type=int, default=20_000)
    parser.add_argument("--answered", type=int, default=5_000)
    parser.add_argument("--answer-kb", type=int, default=12)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()

    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        fresh, demo, mid = (Path(scratch) / name for name in ("fresh", "demo", "mid"))
        for folder in (fresh, demo, mid):
            folder.mkdir()
        fill_demo_tree(demo)
        fingerprint = real_fingerprint()
        fill_mid_run_tree(mid, args.prompts, args.answered, args.answer_kb, fingerprint)
        journals = [real_layout(mid).journal(ds) for ds in real_sets()]
        journal_bytes = sum((journal / RECORDS_FILE).stat().st_size for journal in journals)

        rows.append(("fresh clone", dry_run_seconds(fresh, args.repeats)))
        rows.append(("beside a finished demo", dry_run_seconds(demo, args.repeats)))
        first = dry_run_seconds(mid, 1)
        rows.append(("mid-run, first (tallies every journal)", first))
        rows.append(("mid-run, later (tallies kept)", dry_run_seconds(mid, args.repeats)))

        start = time.perf_counter()
        full = sum(len(load_done(journal, fingerprint)) for journal in journals)
        full_s = time.perf_counter() - start
        start = time.perf_counter()
        kept = sum(len(tally_done(journal, fingerprint)) for journal in journals)
        kept_s = time.perf_counter() - start
        assert full == kept == args.answered * len(journals)

    print(f"real config, {len(journals)} sets x {args.prompts:,} prompts, {args.answered:,} answered per set "
          f"({journal_bytes / 1e6:,.0f} MB of journals)\n")
    print("| work directory | dry runs | median wall s | min wall s | max wall s | median CPU s |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, runs in rows:
        wall, cpu = [w for w, _ in runs], [c for _, c in runs]
        print(f"| {name} | {len(runs)} | {statistics.median(wall):.2f} | {min(wall):.2f} | {max(wall):.2f} "
              f"| {statistics.median(cpu):.2f} |")
    print(f"\njournal reading for the plan, in process: full read {full_s:.2f} s, kept tally {kept_s:.3f} s "
          f"({full_s / kept_s:,.0f}x less)")


if __name__ == "__main__":
    main()
