"""Snakemake adapter: train the EAGLE-3 drafter on every set but the held-out prompts, and export it."""

from pathlib import Path

from eaglepipe.drafter.holdout import select_holdout
from eaglepipe.drafter.train import TrainSettings, train_drafter
from eaglepipe.io import write_json
from eaglepipe.jobs import snakemake_job

with snakemake_job(snakemake) as log:
    holdout = select_holdout(
        [Path(p) for p in snakemake.input.token_stats],
        per_dataset=snakemake.params.holdout_per_dataset,
        explicit=snakemake.params.holdout_ids,
    )
    report = train_drafter(
        [Path(p) for p in snakemake.input.manifests],
        Path(snakemake.params.target),
        Path(snakemake.params.drafter_dir),
        holdout_ids=set(holdout),
        settings=TrainSettings(**snakemake.params.settings),
        checkpoint_dir=Path(snakemake.params.checkpoint_dir),
    )
    write_json(Path(snakemake.output.report), {**report, "holdout_ids": holdout})
    log.info("trained: %s", {k: v for k, v in report.items() if not isinstance(v, list | dict)})
