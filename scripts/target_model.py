"""Snakemake adapter: build the embedded target `params.embedded` at `output.model`."""

from pathlib import Path

from eaglepipe.jobs import snakemake_job
from eaglepipe.target.convert import build_embedded_target

with snakemake_job(snakemake):
    build_embedded_target(
        snakemake.params.embedded, Path(snakemake.output.model), list(map(Path, snakemake.input.teacher))
    )
