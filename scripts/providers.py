"""Snakemake adapter: the configured model's endpoints after the routing policy."""

from pathlib import Path

from eaglepipe.jobs import snakemake_job
from eaglepipe.openrouter.stage import write_providers

with snakemake_job(snakemake):
    write_providers(
        snakemake.config,
        Path(snakemake.output.providers),
        emulator_log=Path(snakemake.log.emulator),
    )
