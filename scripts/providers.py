"""Snakemake adapter: the configured model's endpoints after the routing policy."""

from pathlib import Path

from eaglepipe.openrouter.stage import write_providers

from eaglepipe.jobs import snakemake_job

with snakemake_job(snakemake):
    write_providers(snakemake.config, Path(snakemake.output.providers))
