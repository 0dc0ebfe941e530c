"""Snakemake adapter: hidden-state shards of one prompt set, on the GPUs the job was given."""

from pathlib import Path

from eaglepipe.hidden.extract import HiddenSettings, extract_hidden
from eaglepipe.jobs import snakemake_job

with snakemake_job(snakemake) as log:
    settings = HiddenSettings.from_section(
        snakemake.params.settings,
        target_name=snakemake.params.target_name,
        gpus=int(getattr(snakemake.resources, "gpu", 0)),
    )
    manifest = extract_hidden(
        Path(snakemake.input.tokens),
        Path(snakemake.input.stats),
        Path(snakemake.params.target),
        Path(snakemake.params.shard_dir),
        Path(snakemake.output.manifest),
        settings,
    )
    shards, num_tokens = len(manifest["shards"]), manifest["num_tokens"]
    log.info("%s: %d shards, %d tokens", snakemake.output.manifest, shards, num_tokens)
