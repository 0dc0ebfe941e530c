"""Snakemake adapter: acceptance length of the exported drafter on the held-out prompts."""

from pathlib import Path

from eaglepipe.drafter.evaluate import evaluate
from eaglepipe.drafter.holdout import training_holdout_prompts
from eaglepipe.io import write_json
from eaglepipe.jobs import snakemake_job

with snakemake_job(snakemake) as log:
    settings = snakemake.params.settings
    prompts = training_holdout_prompts(
        Path(snakemake.input.report),
        snakemake.params.datasets,
        [Path(p) for p in snakemake.input.tokens],
        [Path(p) for p in snakemake.input.token_stats],
    )
    result = evaluate(
        Path(snakemake.params.drafter_dir),
        Path(snakemake.params.target),
        [ids for _, _, ids in prompts],
        prompt_ids=[pid for _, pid, _ in prompts],
        prompt_sets=[dataset for dataset, _, _ in prompts],
        num_steps=settings["num_steps"],
        topk=settings["topk"],
        num_draft_tokens=settings["num_draft_tokens"],
        max_new_tokens=settings["max_new_tokens"],
        batch_size=settings["batch_size"],
        device=settings["device"],
        dtype=settings["dtype"],
    )
    write_json(Path(snakemake.output.eval), {**result, "prompt_ids": [pid for _, pid, _ in prompts]})
    log.info("acceptance lengths: %s", {m: r["acceptance_length"] for m, r in result["methods"].items()})
