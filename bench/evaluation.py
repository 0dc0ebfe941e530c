"""Time the drafter evaluation on a finished run and check its figures against the eval.json already there.

The eval.json beside the drafter (written by whichever code evaluated it, e.g. the one-prompt-at-a-time loop
before batching) gives the settings and the reference figures; this re-evaluates the same drafter on the
same held-out prompts with the current code and prints both timings and whether every per-prompt figure
(acceptance length, verify forwards, tokens) is identical.

    .venv/bin/python bench/evaluation.py --results results/demo \\
        --target resources/models/smollm2-135m-instruct \\
        --datasets demo-chat demo-code demo-math demo-multiturn demo-tools
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from eaglepipe.drafter.evaluate import EvalSettings, evaluate
from eaglepipe.drafter.holdout import training_holdout_prompts
from eaglepipe.layout import RunLayout

COMPARED = ("acceptance_length", "target_forwards", "tokens")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--results", required=True, type=Path, help="the run's results root")
    parser.add_argument("--target", required=True, type=Path, help="the target model directory")
    parser.add_argument("--datasets", required=True, nargs="+", help="the run's sets, in config order")
    parser.add_argument("--batch-size", type=int, default=16)
    args = parser.parse_args()

    layout = RunLayout.from_paths(args.results, args.results / "prompts")  # no prompt set is read here
    reference = json.loads(layout.evaluation.read_text())
    held_out = training_holdout_prompts(
        layout.train_report,
        args.datasets,
        [layout.tokens(ds) for ds in args.datasets],
        [layout.token_stats(ds) for ds in args.datasets],
    )
    settings = reference["settings"]
    started = time.perf_counter()
    report = evaluate(
        layout.drafter,
        args.target,
        [ids for _, _, ids in held_out],
        EvalSettings(
            num_steps=settings["num_steps"],
            topk=settings["topk"],
            num_draft_tokens=settings["num_draft_tokens"],
            max_new_tokens=settings["max_new_tokens"],
            batch_size=args.batch_size,
            device="cpu",
            dtype=settings["dtype"],
            seed=settings["seed"],
        ),
        prompt_ids=[pid for _, pid, _ in held_out],
        prompt_sets=[ds for ds, _, _ in held_out],
    )
    total = time.perf_counter() - started
    k, max_new_tokens = settings["num_steps"], settings["max_new_tokens"]
    print(
        f"{len(held_out)} held-out prompts, k {k}, max_new_tokens {max_new_tokens}, batch {args.batch_size}",
    )
    # Older eval.json files timed each method on its own; now all methods share one run.
    before_s = reference.get("seconds") or sum(m["seconds"] for m in reference["methods"].values())
    print(f"draft-and-verify seconds, all methods: eval.json {before_s:.2f}, now {report['seconds']:.2f}")
    print(f"{'method':<18} {'accept len':>10} identical per prompt")
    for name, method in report["methods"].items():
        before = reference["methods"][name]
        same = [
            {k: ours[k] for k in COMPARED} == {k: theirs[k] for k in COMPARED}
            for ours, theirs in zip(method["per_prompt"], before["per_prompt"], strict=True)
        ]
        print(f"{name:<18} {method['acceptance_length']:>10} {all(same)} ({sum(same)}/{len(same)})")
    print(f"whole evaluation now, models loaded included: {total:.1f} s")


if __name__ == "__main__":
    main()
