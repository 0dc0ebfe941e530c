"""Snakemake adapter: the generate jobs' operational settings, from the rule's params."""

from pathlib import Path

from eaglepipe.answers.stage import write_generation_settings
from eaglepipe.jobs import snakemake_job

with snakemake_job(snakemake):
    write_generation_settings(Path(snakemake.output.settings), snakemake.params.operational)
