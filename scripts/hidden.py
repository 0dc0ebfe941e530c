"""Snakemake adapter: hidden-state shards of one prompt set."""

from pathlib import Path

from eaglepipe.hidden.extract import extract_hidden
from eaglepipe.jobs import snakemake_job

with snakemake_job(snakemake) as log:
    manifest = extract_hidden(
        Path(snakemake.input.tokens),
        Path(snakemake.input.stats),
        Path(snakemake.params.target),
        Path(snakemake.params.shard_dir),
        Path(snakemake.output.manifest),
        target_name=snakemake.params.target_name,
        aux_layers=snakemake.params.aux_layers,
        dtype=snakemake.params.dtype,
        device=snakemake.config["hidden"]["device"],
        shard_tokens=snakemake.config["hidden"]["shard_tokens"],
        batch_tokens=snakemake.config["hidden"]["batch_tokens"],
    )
    shards, num_tokens = len(manifest["shards"]), manifest["num_tokens"]
    log.info("%s: %d shards, %d tokens", snakemake.output.manifest, shards, num_tokens)
