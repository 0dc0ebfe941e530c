"""Snakemake adapter: train the EAGLE-3 drafter on every set but the held-out prompts, and export it."""

from pathlib import Path

from eaglepipe.drafter.distributed import train_data_parallel
from eaglepipe.drafter.holdout import select_holdout
from eaglepipe.drafter.train import TrainSettings
from eaglepipe.io import write_json
from eaglepipe.jobs import snakemake_job

with snakemake_job(snakemake) as log:
    holdout = select_holdout(
        [Path(p) for p in snakemake.input.token_stats],
        per_dataset=snakemake.params.holdout_per_dataset,
        explicit=snakemake.params.holdout_ids,
    )
    settings = TrainSettings.from_section(snakemake.params.settings)
    # One rank per GPU the job was given (data parallel through torchrun); on the CPU, this process.
    gpus = int(getattr(snakemake.resources, "gpu", 0))
    report = train_data_parallel(
        gpus if settings.device.startswith("cuda") else 1,
        [Path(p) for p in snakemake.input.manifests],
        Path(snakemake.params.target),
        Path(snakemake.params.drafter_dir),
        holdout_ids=set(holdout),
        settings=settings,
        checkpoint_dir=Path(snakemake.params.checkpoint_dir),
        set_names=list(snakemake.params.datasets),
        snapshot_dir=Path(snakemake.output.snapshots),
    )
    write_json(Path(snakemake.output.report), {**report, "holdout_ids": holdout})
    log.info("trained: %s", {k: v for k, v in report.items() if not isinstance(v, list | dict)})
