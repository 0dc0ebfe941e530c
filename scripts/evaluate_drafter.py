"""Snakemake adapter: acceptance length of the exported drafter on the held-out prompts."""

from pathlib import Path

from eaglepipe.drafter.evaluate import EvalSettings, evaluate
from eaglepipe.drafter.holdout import training_holdout_prompts
from eaglepipe.io import write_json
from eaglepipe.jobs import snakemake_job

with snakemake_job(snakemake) as log:
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
        EvalSettings.from_section(snakemake.params.settings),
        prompt_ids=[pid for _, pid, _ in prompts],
        prompt_sets=[dataset for dataset, _, _ in prompts],
    )
    write_json(Path(snakemake.output.eval), {**result, "prompt_ids": [pid for _, pid, _ in prompts]})
    log.info("acceptance lengths: %s", {m: r["acceptance_length"] for m, r in result["methods"].items()})
