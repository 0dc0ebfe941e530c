"""Hidden-state storage formats side by side (issue 38, docs/hidden.md "Storage"): the same bought answers,
their hidden states stored as float32, bfloat16, fp8, int4 and int3, a drafter trained on each with the
same seed and steps, and its acceptance length by the project's draft-and-verify evaluation on the same
held-out prompts. float32 trained again with another seed shows how far retraining alone moves the
figure. Also: bytes per token as the shards hold them, encode and decode throughput of each codec on this
CPU, and each training's loss curve (first, middle and last points).

    .venv/bin/python bench/storage.py [--target smollm2|kimi-tiny] [--keep DIR] [--rows LABEL ...]

Runs Snakemake on a scratch directory beside this checkout's resources (the embedded targets are built
there once); nothing under results/ is touched. The Kimi-shaped target's hidden states come from the hf
backend here (its profile uses vLLM): what is compared is how they are stored.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import yaml
from safetensors.torch import load_file

from eaglepipe.hidden.shards import state_codec
from eaglepipe.layout import RunLayout

REPO = Path(__file__).resolve().parent.parent
LAYOUT = RunLayout.from_paths("results/storage", "results/storage/prompts")
CONFIGS = {"smollm2": "config/local.yaml", "kimi-tiny": "config/kimi-tiny.yaml"}
# (row label, hidden.dtype, drafter.seed)
ROWS = [
    ("float32", "float32", 0),
    ("float32, seed 1", "float32", 1),
    ("bfloat16", "bfloat16", 0),
    ("fp8", "fp8", 0),
    ("int4", "int4", 0),
    ("int3", "int3", 0),
]
TIMED_CODECS = ("bfloat16", "fp8", "int4", "int3")


def snakemake(workdir: Path, config: str, *extra: str) -> None:
    command = [
        sys.executable, "-m", "snakemake", str(LAYOUT.evaluation), "-s", str(REPO / "Snakefile"),
        "--directory", str(workdir), "--configfile", str(REPO / config), str(workdir / "bench.yaml"),
        "--cores", "2", "--resources", "api=2", *extra,
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(done.stderr[-4000:])


def shard_figures(workdir: Path, sets: list[str], dtype: str) -> tuple[float, int]:
    """(bytes per token over every shard file, tokens)."""
    size = tokens = 0
    for ds in sets:
        manifest_path = workdir / LAYOUT.hidden_done(ds)
        manifest = json.loads(manifest_path.read_text())
        assert manifest["dtype"] == dtype, (manifest["dtype"], dtype)
        for entry in manifest["shards"]:
            size += (manifest_path.parent / entry["path"]).stat().st_size
            tokens += entry["num_tokens"]
    return size / tokens, tokens


def codec_speed(workdir: Path, sets: list[str], dtype: str) -> tuple[float, float]:
    """(encode, decode) tokens per second over the float32 shards, one thread."""
    manifests = [workdir / LAYOUT.hidden_done(ds) for ds in sets]
    shards = [
        load_file(str(manifest.parent / entry["path"]))
        for manifest in manifests
        for entry in json.loads(manifest.read_text())["shards"]
    ]
    codec = state_codec(dtype, shards[0]["final"].shape[1])
    tokens = sum(len(shard["final"]) for shard in shards)
    started = time.perf_counter()
    encoded = [codec.encode(shard["aux"], shard["final"]) for shard in shards]
    encoding = time.perf_counter() - started
    started = time.perf_counter()
    for stored in encoded:
        codec.decode(stored)
    return tokens / encoding, tokens / (time.perf_counter() - started)


def loss_points(workdir: Path) -> list[float]:
    curve = json.loads((workdir / LAYOUT.train_report).read_text())["loss_curve"]
    losses = [point["loss"] for point in curve]
    return [losses[0], losses[len(losses) // 2], losses[-1]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", choices=sorted(CONFIGS), default="smollm2")
    parser.add_argument("--keep", type=Path, help="keep the scratch directory here")
    parser.add_argument("--rows", nargs="+", default=[label for label, _, _ in ROWS], metavar="LABEL",
                        help="the rows to run, in this order (default: all of them)")
    args = parser.parse_args()
    config = CONFIGS[args.target]
    sets = yaml.safe_load((REPO / config).read_text())["datasets"]
    torch.set_num_threads(1)
    rows: list[dict] = []
    speeds: dict[str, tuple[float | None, float | None]] = {}
    with tempfile.TemporaryDirectory(prefix="eaglepipe-storage-") as scratch:
        workdir = args.keep or Path(scratch)
        workdir.mkdir(parents=True, exist_ok=True)
        if not (workdir / "resources").exists():
            (workdir / "resources").symlink_to(REPO / "resources")
        by_label = {label: (label, dtype, seed) for label, dtype, seed in ROWS}
        for label, dtype, seed in [by_label[label] for label in args.rows]:
            overrides = {
                "paths": {"results": str(LAYOUT.results), "prompts": str(LAYOUT.prompts)},
                "hidden": {"backend": "hf", "dtype": dtype},
                "drafter": {"seed": seed},
            }
            (workdir / "bench.yaml").write_text(yaml.safe_dump(overrides))
            # The first row builds the whole chain; each later one recomputes the hidden states (only the
            # storage changed) or retrains (only the seed changed), then evaluates.
            forced = []
            if rows:
                forced = ["--forcerun", "hidden" if dtype != rows[-1]["dtype"] else "train_drafter"]
            started = time.perf_counter()
            snakemake(workdir, config, *forced)
            per_token, tokens = shard_figures(workdir, sets, dtype)
            evaluation = json.loads((workdir / LAYOUT.evaluation).read_text())
            rows.append({
                "label": label, "dtype": dtype, "bytes_per_token": per_token, "tokens": tokens,
                "acceptance": evaluation["methods"]["eagle3"]["acceptance_length"],
                "held_out": evaluation.get("held_out_prompts"), "loss": loss_points(workdir),
                "seconds": time.perf_counter() - started,
            })  # fmt: skip
            if dtype == "float32" and not speeds:
                speeds = {name: codec_speed(workdir, sets, name) for name in TIMED_CODECS}
            print(json.dumps(rows[-1]), flush=True)
    base = next(row for row in rows if row["label"] == "float32")
    print(f"{args.target}: {base['tokens']:,} tokens of hidden states, acceptance on {base['held_out']} "
          "held-out prompts (the project's evaluation)")  # fmt: skip
    print(f"{'storage':16} {'B/token':>8} {'vs f32':>7} {'encode tok/s':>13} {'decode tok/s':>13} "
          f"{'acceptance':>10} {'vs f32':>7} {'loss first/mid/last':>22}")  # fmt: skip
    for row in rows:
        encode, decode = speeds.get(row["dtype"], (None, None))
        ratio = base["bytes_per_token"] / row["bytes_per_token"]
        change = 100 * (row["acceptance"] / base["acceptance"] - 1)
        print(
            f"{row['label']:16} {row['bytes_per_token']:>8,.0f} {ratio:>6.1f}x "
            f"{f'{encode:,.0f}' if encode else '-':>13} {f'{decode:,.0f}' if decode else '-':>13} "
            f"{row['acceptance']:>10.4f} {change:>+6.1f}% {'/'.join(f'{v:.3f}' for v in row['loss']):>22}"
        )

if __name__ == "__main__":
    main()
