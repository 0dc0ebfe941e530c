"""Drafter training: tokens/s on this machine (one process, and two data-parallel CPU ranks, in the same
run) on a finished run's hidden states, and an estimate of the real run on 8 GPUs.

Each row trains from scratch for `--steps` optimizer steps with the run's drafter settings (from its
train.json) and reports the tokens/s of the fit. The estimate counts the FLOPs per token of the draft
layer, `fc`, the draft head (forward and backward, per unroll step) and the frozen target head the teacher
applies (forward only), against the GPUs' bf16 rate at an assumed utilisation.

    .venv/bin/python bench/training.py --results results/demo \\
        --target resources/models/smollm2-135m-instruct --datasets demo-chat demo-code demo-math \\
        demo-multiturn demo-tools
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import tempfile
from pathlib import Path

import torch

from eaglepipe.drafter.distributed import train_data_parallel
from eaglepipe.drafter.model import Eagle3Config, Eagle3Drafter
from eaglepipe.drafter.train import TrainSettings
from eaglepipe.layout import RunLayout
from eaglepipe.target.architecture import TargetArchitecture
from eaglepipe.target.layer_ids import default_aux_layers

KIMI_TEXT_CONFIG = {  # Kimi-K2.5's language model, as the drafter mirrors it
    "hidden_size": 7168,
    "num_attention_heads": 64,
    "num_key_value_heads": 64,
    "num_hidden_layers": 61,
    "vocab_size": 163840,
    "intermediate_size": 18432,
    "rms_norm_eps": 1e-6,
    "max_position_embeddings": 262144,
}
H200_BF16_DENSE_FLOPS = 989e12
MFU = (0.3, 0.5)  # assumed range for a one-layer model with large matmuls
TTT_LENGTH, DRAFT_VOCAB, TRAIN_TOKENS, EPOCHS = 7, 32000, 40e6, 2


def measure(
    name: str, processes: int, settings: TrainSettings, manifests: list[Path], target: Path, holdout: set[str]
) -> dict:
    with tempfile.TemporaryDirectory() as scratch:
        report = train_data_parallel(
            processes, manifests, target, Path(scratch), holdout_ids=holdout, settings=settings
        )
    return {
        "run": name,
        "ranks": processes,
        "steps": report["steps"],
        "tokens_seen": report["tokens_seen"],
        "tokens_per_s": report["tokens_per_second"],
    }


def draft_flops_per_token() -> tuple[float, int]:
    """(training FLOPs per target token, trainable parameters) of the Kimi-K2.5 drafter."""
    target = TargetArchitecture.from_config(KIMI_TEXT_CONFIG, "Kimi-K2.5 text_config")
    config = Eagle3Config.from_target(target, DRAFT_VOCAB, default_aux_layers(61))
    with torch.device("meta"):
        drafter = Eagle3Drafter(config, torch.empty(config.vocab_size, config.hidden_size))
    size = {name: p.numel() for name, p in drafter.named_parameters() if p.requires_grad}
    layer = sum(n for name, n in size.items() if name.startswith("midlayer."))
    head, fc = size["lm_head.weight"], size["fc.weight"]
    train = 6 * (TTT_LENGTH * (layer + head) + fc)  # forward + backward, per unroll step
    teacher = 2 * config.draft_vocab_size * config.hidden_size  # the frozen head's draft rows, forward
    return train + teacher, sum(size.values())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--results", required=True, type=Path)
    parser.add_argument("--target", required=True, type=Path)
    parser.add_argument("--datasets", required=True, nargs="+")
    parser.add_argument("--steps", type=int, default=24)
    args = parser.parse_args()

    layout = RunLayout.from_paths(args.results, args.results / "prompts")  # no prompt set is read here
    run = json.loads(layout.train_report.read_text())
    known = {field.name for field in dataclasses.fields(TrainSettings)}
    settings = TrainSettings(**{k: v for k, v in run["settings"].items() if k in known})
    settings = dataclasses.replace(settings, max_steps=args.steps, checkpoint_every=0, device="cpu")
    manifests = [layout.hidden_done(ds) for ds in args.datasets]
    holdout = set(run["holdout_ids"])
    rows = [
        measure("one process", 1, settings, manifests, args.target, holdout),
        measure("two gloo ranks", 2, settings, manifests, args.target, holdout),
    ]
    for row in rows:
        print(json.dumps(row))
    flops, params = draft_flops_per_token()
    total = TRAIN_TOKENS * EPOCHS
    print(
        f"estimate for the real run: Kimi-K2.5 drafter, {params / 1e9:.2f}B trainable parameters, "
        f"draft vocab {DRAFT_VOCAB:,}, TTT {TTT_LENGTH}: {flops / 1e9:.0f} GFLOP per token; "
        f"{TRAIN_TOKENS / 1e6:.0f}M tokens x {EPOCHS} epochs on 8 x H200 "
        f"({H200_BF16_DENSE_FLOPS / 1e12:.0f} TFLOP/s bf16, MFU {MFU[0]:.0%}-{MFU[1]:.0%}):"
    )
    for mfu in MFU:
        rate = 8 * H200_BF16_DENSE_FLOPS * mfu / flops
        print(f"  MFU {mfu:.0%}: {rate:,.0f} tokens/s, {total / rate / 3600:.1f} h")


if __name__ == "__main__":
    main()
