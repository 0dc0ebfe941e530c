"""Hidden-state extraction: tokens/s and bytes/token per backend on a real token file, and an estimate of
the real run (Kimi-K2.5 on one 8-GPU node).

Each backend extracts the same set into a scratch folder, in this one run (the machine is noisy: compare
rows, not runs). tokens/s counts the extraction with the engine already started; the start (model load,
vLLM's engine start) is reported apart. Bytes/token are the shard files' sizes over the tokens they hold.

    .venv/bin/python bench/hidden.py --results results/demo --set demo-tools \\
        --target resources/models/smollm2-135m-instruct --vllm-python .venv-vllm/bin/python
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

from eaglepipe.hidden.extract import HiddenSettings, extract_hidden, open_backend, read_set_tokens
from eaglepipe.hidden.storage import bytes_per_token
from eaglepipe.layout import RunLayout
from eaglepipe.target.architecture import TargetArchitecture
from eaglepipe.target.layer_ids import default_aux_layers

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from stage_settings import hidden_settings  # noqa: E402  (the schema's defaults, as the tests build them)

# The estimate's assumptions, printed with it.
KIMI = {"active_params": 32e9, "hidden_size": 7168}
H200_BF16_DENSE_FLOPS = 989e12
PREFILL_MFU = (0.25, 0.45)  # model FLOPs utilisation a large-batch MoE prefill reaches (assumed range)
SAMPLES, TOKENS_PER_SAMPLE = 10_000, 4_000
DISK_WRITE_BYTES_PER_S = 2e9  # one node's local NVMe, sustained (assumed)


def measure(name: str, settings: HiddenSettings, run: RunLayout, ds: str, target: Path) -> dict:
    data = read_set_tokens(run.tokens(ds), run.token_stats(ds), settings)
    architecture = TargetArchitecture.from_dir(target)
    layers = default_aux_layers(architecture.num_layers)
    longest = max(len(ids) for ids in data.samples)
    started = time.perf_counter()
    with open_backend(settings.backend, target, layers, architecture, longest) as backend:
        backend.states(data.samples[:1])  # warm: loads the model or starts the engine
        ready = time.perf_counter()
        backend.states(data.samples)
        done = time.perf_counter()
    n = sum(len(ids) for ids in data.samples)
    row = {
        "backend": name,
        "tokens": n,
        "start_s": round(ready - started, 1),
        "tokens_per_s": round(n / (done - ready), 1),
    }
    with tempfile.TemporaryDirectory() as scratch:
        extracted = RunLayout.from_paths(scratch, Path(scratch) / "prompts")
        manifest = extract_hidden(
            run.tokens(ds),
            run.token_stats(ds),
            target,
            extracted.shards(ds),
            extracted.hidden_done(ds),
            settings,
        )
        size = sum((extracted.set_dir(ds) / entry["path"]).stat().st_size for entry in manifest["shards"])
    row["bytes_per_token"] = round(size / manifest["num_tokens"], 1)
    return row


def estimate() -> list[str]:
    flops_per_token = 2 * KIMI["active_params"]
    tokens = SAMPLES * TOKENS_PER_SAMPLE
    lines = [
        f"estimate for the real run: {SAMPLES:,} samples x {TOKENS_PER_SAMPLE:,} tokens = "
        f"{tokens / 1e6:.0f}M tokens, prefill {flops_per_token / 1e9:.0f} GFLOP/token (2 x 32B active "
        f"parameters, attention left out), 8 x H200 at {H200_BF16_DENSE_FLOPS / 1e12:.0f} TFLOP/s bf16 "
        f"dense, MFU {PREFILL_MFU[0]:.0%}-{PREFILL_MFU[1]:.0%}, "
        f"disk writes at {DISK_WRITE_BYTES_PER_S / 1e9:.0f} GB/s"
    ]
    lines.append("dtype     B/token   shards    tokens/s (compute)   compute time   disk-write time")
    for dtype in ("bfloat16", "fp8"):
        per_token = bytes_per_token(KIMI["hidden_size"], dtype)
        rates = [8 * H200_BF16_DENSE_FLOPS * mfu / flops_per_token for mfu in PREFILL_MFU]
        hours = [tokens / rate / 3600 for rate in reversed(rates)]
        write_hours = tokens * per_token / DISK_WRITE_BYTES_PER_S / 3600
        lines.append(
            f"{dtype:9} {per_token:>7,}   {tokens * per_token / 1e12:.2f} TB   "
            f"{rates[0]:,.0f}-{rates[1]:,.0f}        {hours[0]:.1f}-{hours[1]:.1f} h        "
            f"{write_hours:.1f} h"
        )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--results", required=True, type=Path, help="the results root of a run with tokens")
    parser.add_argument("--set", required=True, help="the set whose tokens are extracted")
    parser.add_argument("--target", required=True, type=Path)
    parser.add_argument("--vllm-python", help="the vLLM environment's interpreter; without it, hf only")
    args = parser.parse_args()

    runs = [
        (
            "hf float32",
            hidden_settings(target_name="bench", dtype="float32", keep_free_gb=0),
        ),
        (
            "hf fp8 (bf16 compute)",
            hidden_settings(target_name="bench", dtype="fp8", keep_free_gb=0),
        ),
    ]
    if args.vllm_python:
        runs.append(
            (
                "vllm float32",
                hidden_settings(
                    target_name="bench",
                    backend="vllm",
                    engine_python=args.vllm_python,
                    dtype="float32",
                    keep_free_gb=0,
                ),
            )
        )
    run = RunLayout.from_paths(args.results, args.results / "prompts")  # no prompt set is read here
    rows = [measure(name, settings, run, args.set, args.target) for name, settings in runs]
    for row in rows:
        print(json.dumps(row))
    print("\n".join(estimate()))


if __name__ == "__main__":  # vLLM's engine spawns processes
    main()
