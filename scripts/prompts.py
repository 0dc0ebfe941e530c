"""Snakemake adapter: one prompt set from its source."""

from pathlib import Path

from eaglepipe.jobs import snakemake_job
from eaglepipe.prompts import build_from_source

with snakemake_job(snakemake) as log:
    source = snakemake.params.source
    default_strip = True if source["type"] == "hf" else snakemake.params.strip_trailing_assistant
    stats = build_from_source(
        source,
        Path(snakemake.output.prompts),
        seed=snakemake.params.seed,
        strip_trailing_assistant=source.get("strip_trailing_assistant", default_strip),
    )
    log.info("%s: %s", snakemake.output.prompts, stats)
