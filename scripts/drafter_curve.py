"""Snakemake adapter: the learning curve, acceptance of the drafters kept along training."""

from pathlib import Path

from eaglepipe.drafter.evaluate import EvalSettings, learning_curve
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
    curve = learning_curve(
        Path(snakemake.input.snapshots),
        Path(snakemake.params.drafter_dir),
        Path(snakemake.params.target),
        [ids for _, _, ids in prompts],
        EvalSettings.from_section(snakemake.params.settings),
    )
    write_json(Path(snakemake.output.curve), curve)
    log.info(
        "acceptance by tokens seen: %s; prompt lookup %s",
        {p["tokens_seen"]: p["acceptance_length"] for p in curve["points"]},
        curve["prompt_lookup"]["acceptance_length"],
    )
