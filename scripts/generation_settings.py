"""Snakemake adapter: the generate jobs' operational settings, from the rule's params."""

from pathlib import Path

from eaglepipe.jobs import snakemake_job
from eaglepipe.openrouter.stage import write_job_settings

with snakemake_job(snakemake):
    write_job_settings(Path(snakemake.output.settings), snakemake.params.operational)
