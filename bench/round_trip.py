"""The round-trip gate on real engine text: the demo's prompt sets answered by real vLLM (the engine source,
the job starting `vllm serve` from .venv-vllm on the embedded SmolLM2) and by the emulator asked for ids,
each through the token stage, which rebuilds every answer's ids from its text and compares them with the
ids the server returned.

    .venv/bin/python bench/round_trip.py [--sets demo-chat,...] [--max-tokens 96]
    .venv/bin/python bench/round_trip.py --temperature 1.0 --top-p 0.95 --seed 7 --max-tokens 1024 \\
        --servers vllm          # the real run's sampling, long answers, real vLLM only

Prints, per server and set, answers with server ids, rebuilt exactly, count-matched but different, off,
and the first misses; then, per answer-length bucket, what truly differs (the split only, or the
structure) against what the text-only rebuild labelled, and the share of output tokens the token stage
would train on were the answers text only (as OpenRouter's are): before this project learned to keep
answers that differ only in their split (every miss dropped) and now. Runs Snakemake on a scratch
directory (`--keep DIR` to keep it, and to reuse it: a second run with the same DIR buys nothing again and
reruns only the stages whose code or settings changed); nothing under results/ is touched.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

import yaml

from eaglepipe.layout import RunLayout

REPO = Path(__file__).resolve().parent.parent
MODEL_DIR = REPO / "resources" / "models" / "smollm2-135m-instruct"
VLLM_PYTHON = REPO / ".venv-vllm" / "bin" / "python"
SOURCES = REPO / "resources" / "sources" / "demo"
DEMO_SETS = ("demo-chat", "demo-code", "demo-math", "demo-multiturn")
SERVERS = {"vllm": ("vllm 0.32 (engine)", True), "emulator": ("emulator (ids)", False)}
LAYOUT = RunLayout.from_paths("results", "results/prompts")  # in the work directory


def config(sets: list[str], args: argparse.Namespace, engine: bool) -> dict:
    sampling = {"temperature": args.temperature, "top_p": args.top_p, "seed": args.seed}
    return {
        "paths": {"results": str(LAYOUT.results), "prompts": str(LAYOUT.prompts)},
        "datasets": sets,
        "sources": {ds: {"type": "jsonl", "path": str(SOURCES / f"{ds}.jsonl")} for ds in sets},
        "target": {"name": "HuggingFaceTB/SmolLM2-135M-Instruct", "path": str(MODEL_DIR), "embedded": False},
        "api": {"base_url": "local", "model": "local/smollm2-135m-instruct"},
        "answers": {"source": "engine" if engine else "openrouter"},
        "engine": {"python": str(VLLM_PYTHON), "gpus": 0, "start_timeout_s": 600,
                   "args": ["--max-model-len", "4096", "--enforce-eager"]},
        "generation": {"concurrency": 16, "max_tokens": args.max_tokens, **sampling,
                       "return_token_ids": True, "reasoning": None, "request_timeout_s": 3600},
        "budget": {"usd": 1.0, "output_tokens_per_dataset": 10_000_000},
    }


def run(sets: list[str], args: argparse.Namespace, engine: bool, workdir: Path) -> dict[str, dict]:
    """Each set's tokens.json and its answers (responses.jsonl), after the chain up to the token stage; a
    kept directory of an earlier run is brought up to date (only what changed reruns)."""
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "run.yaml").write_text(yaml.safe_dump(config(sets, args, engine)))
    targets = [str(LAYOUT.token_stats(ds)) for ds in sets]
    # Targets first: the spend plan reads them from the command line.
    command = [sys.executable, "-m", "snakemake", *targets, "-s", str(REPO / "Snakefile"),
               "--directory", str(workdir), "--configfile", str(workdir / "run.yaml"),
               "--cores", "2", "--resources", "api=1"]
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "2"}
    done = subprocess.run(command, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        sys.exit(done.stderr[-4000:])
    return {
        ds: {
            "tokens": json.loads((workdir / LAYOUT.token_stats(ds)).read_text()),
            "responses": [json.loads(line) for line in (workdir / LAYOUT.responses(ds)).open()],
        }
        for ds in sets
    }


def text_only_yield(by_set: dict[str, dict]) -> dict[str, Counter]:
    """Per length bucket: answers and their billed tokens by truth, label and whether the text-only rebuild
    keeps them, today and before segmentation-only answers were kept (every `off` miss dropped)."""
    buckets: dict[str, Counter] = {}
    for found in by_set.values():
        gate = found["tokens"]["round_trip"]
        misses = {miss["prompt_id"]: miss for miss in gate["misses"]}
        if len(misses) < gate["count_matched"] + gate["off"]:
            sys.exit("more misses than tokens.json lists (50): run fewer prompts per set")
        for record in found["responses"]:
            tokens = record["usage"]["completion_tokens"]
            length = len(record["response"].get("token_ids") or [])
            bucket = buckets.setdefault(_bucket(length), Counter())
            miss = misses.get(record["prompt_id"])
            truth = "exact" if miss is None else miss["truth"]
            label = "rebuilt_count_matched" if miss is None else miss["rebuilt_method"]
            bucket.update({"answers": 1, f"answers {truth}": 1, "tokens": tokens, f"tokens {truth}": tokens})
            kept_now = label not in ("rebuilt_off_by_k",)
            kept_before = label not in ("rebuilt_off_by_k", "rebuilt_segmentation_only")
            bucket.update({"kept now": tokens * kept_now, "kept before": tokens * kept_before,
                           f"labelled {label}": 1})
    return buckets


def _bucket(length: int) -> str:
    for low, high in ((0, 128), (128, 512), (512, 2048)):
        if length < high:
            return f"{low}-{high - 1}"
    return "2048+"


def _share(part: float, whole: float) -> str:
    return f"{100 * part / whole:.1f}%" if whole else "-"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sets", default=",".join(DEMO_SETS))
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--servers", default=",".join(SERVERS))
    parser.add_argument("--keep", type=Path, help="keep the scratch directory here")
    args = parser.parse_args()
    sets = args.sets.split(",")
    with tempfile.TemporaryDirectory(prefix="eaglepipe-round-trip-") as scratch:
        root = args.keep or Path(scratch)
        servers = args.servers.split(",")
        figures = {SERVERS[name][0]: run(sets, args, SERVERS[name][1], root / name) for name in servers}
    print(f"temperature {args.temperature:g}, top_p {args.top_p:g}, seed {args.seed}, "
          f"max_tokens {args.max_tokens}")
    print(f"{'server':20} {'set':16} {'answers':>7} {'exact':>6} {'count=':>6} {'off':>4}  first misses")
    for server, by_set in figures.items():
        for ds, found in by_set.items():
            gate = found["tokens"]["round_trip"]
            misses = ", ".join(f"{m['prompt_id']}@{m['first_difference']}" for m in gate["misses"][:3])
            print(f"{server:20} {ds:16} {gate['samples']:>7} {gate['exact']:>6} {gate['count_matched']:>6} "
                  f"{gate['off']:>4}  {misses or '-'}")
    print()
    print_yield(figures)


HEADER = (
    f"{'server':20} {'length':9} {'answers':>7} {'exact':>6} {'split':>6} {'special':>7} {'struct':>6} "
    f"{'labelled split':>14} {'tokens':>8} {'kept before':>11} {'kept now':>9}"
)


def print_yield(figures: dict[str, dict[str, dict]]) -> None:
    """Per server (or mode) and length bucket: what truly differs against the label, and the yield."""
    print(HEADER)
    for server, by_set in figures.items():
        buckets = text_only_yield(by_set)
        total: Counter = Counter()
        for name in sorted(buckets, key=lambda b: int(b.rstrip("+").split("-")[0])):
            total.update(buckets[name])
            row(server, name, buckets[name])
        row(server, "all", total)
        precision = [found["tokens"]["round_trip"]["segmentation_only"] for found in by_set.values()]
        print(precision_line(server, precision))


def row(server: str, bucket: str, counts: Any) -> None:
    """split: only the split differs; special: a special id the model wrote mid-answer that the engine
    dropped from its text; struct: any other structural difference."""
    before = _share(counts["kept before"], counts["tokens"])
    now = _share(counts["kept now"], counts["tokens"])
    print(f"{server:20} {bucket:9} {counts['answers']:>7} {counts['answers exact']:>6} "
          f"{counts['answers segmentation']:>6} {counts['answers dropped_special']:>7} "
          f"{counts['answers structural']:>6} {counts['labelled rebuilt_segmentation_only']:>14} "
          f"{counts['tokens']:>8} {before:>11} {now:>9}")


def precision_line(server: str, gates: list[dict[str, Any]]) -> str:
    labelled = sum(g["labelled"] for g in gates)
    truly = sum(g["truly_segmentation"] for g in gates)
    stray = sum(g["dropped_special"] for g in gates)
    return (f"{server:20} segmentation-only label: {truly} of {labelled} truly split-only, {stray} a special "
            "id the engine dropped from its text")


if __name__ == "__main__":
    main()
