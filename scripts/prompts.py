"""Snakemake adapter: one prompt set from its source."""

from pathlib import Path

from eaglepipe.jobs import snakemake_job
from eaglepipe.prompts import build_from_source, strip_setting

with snakemake_job(snakemake) as log:
    source, strip = strip_setting(snakemake.params.source, snakemake.params.strip_trailing_assistant)
    stats = build_from_source(
        source, Path(snakemake.output.prompts), seed=snakemake.params.seed, strip_trailing_assistant=strip
    )
    log.info("%s: %s", snakemake.output.prompts, stats)
