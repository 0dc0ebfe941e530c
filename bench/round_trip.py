"""The round-trip gate on real engine text: the demo's prompt sets answered by real vLLM (the engine source,
the job starting `vllm serve` from .venv-vllm on the embedded SmolLM2) and by the emulator asked for ids,
each through the token stage, which rebuilds every answer's ids from its text and compares them with the
ids the server returned.

    .venv/bin/python bench/round_trip.py [--sets demo-chat,demo-code,...] [--max-tokens 96]

Prints one row per set and server: answers with server ids, rebuilt exactly, count-matched but different,
off, and the first differing position of the first misses. Runs Snakemake on a scratch directory; nothing
under results/ is touched.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
MODEL_DIR = REPO / "resources" / "models" / "smollm2-135m-instruct"
VLLM_PYTHON = REPO / ".venv-vllm" / "bin" / "python"
SOURCES = REPO / "resources" / "sources" / "demo"
DEMO_SETS = ("demo-chat", "demo-code", "demo-math", "demo-multiturn")


def config(sets: list[str], max_tokens: int, engine: bool) -> dict:
    return {
        "paths": {"results": "results", "prompts": "results/prompts"},
        "datasets": sets,
        "sources": {ds: {"type": "jsonl", "path": str(SOURCES / f"{ds}.jsonl")} for ds in sets},
        "target": {"name": "HuggingFaceTB/SmolLM2-135M-Instruct", "path": str(MODEL_DIR), "embedded": False},
        "api": {"base_url": "local", "model": "local/smollm2-135m-instruct"},
        "answers": {"source": "engine" if engine else "openrouter"},
        "engine": {"python": str(VLLM_PYTHON), "gpus": 0, "start_timeout_s": 600,
                   "args": ["--max-model-len", "4096", "--enforce-eager"]},
        "generation": {"concurrency": 16, "max_tokens": max_tokens, "temperature": 0.0, "top_p": 1.0,
                       "return_token_ids": True, "reasoning": None, "request_timeout_s": 600},
        "budget": {"usd": 1.0},
    }


def run(sets: list[str], max_tokens: int, engine: bool, workdir: Path) -> dict[str, dict]:
    workdir.mkdir(parents=True)
    (workdir / "run.yaml").write_text(yaml.safe_dump(config(sets, max_tokens, engine)))
    targets = [f"results/{ds}/tokens.json" for ds in sets]
    # Targets first: the spend plan reads them from the command line.
    command = [sys.executable, "-m", "snakemake", *targets, "-s", str(REPO / "Snakefile"),
               "--directory", str(workdir), "--configfile", str(workdir / "run.yaml"),
               "--cores", "2", "--resources", "api=1"]
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "2"}
    done = subprocess.run(command, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        sys.exit(done.stderr[-4000:])
    stats = {ds: json.loads((workdir / "results" / ds / "tokens.json").read_text()) for ds in sets}
    return {ds: stats[ds]["round_trip"] for ds in sets}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sets", default=",".join(DEMO_SETS))
    parser.add_argument("--max-tokens", type=int, default=96)
    args = parser.parse_args()
    sets = args.sets.split(",")
    with tempfile.TemporaryDirectory(prefix="eaglepipe-round-trip-") as scratch:
        figures = {
            "vllm 0.32 (engine)": run(sets, args.max_tokens, True, Path(scratch) / "vllm"),
            "emulator (ids)": run(sets, args.max_tokens, False, Path(scratch) / "emulator"),
        }
    print(f"{'server':20} {'set':16} {'answers':>7} {'exact':>6} {'count=':>6} {'off':>4}  first misses")
    for server, by_set in figures.items():
        for ds, gate in by_set.items():
            misses = ", ".join(f"{m['prompt_id']}@{m['first_difference']}" for m in gate["misses"][:3])
            print(f"{server:20} {ds:16} {gate['samples']:>7} {gate['exact']:>6} {gate['count_matched']:>6} "
                  f"{gate['off']:>4}  {misses or '-'}")


if __name__ == "__main__":
    main()
