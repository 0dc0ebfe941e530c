"""Snakemake adapter: one prompt set from its source."""

from pathlib import Path

from eaglepipe.jobs import snakemake_job
from eaglepipe.prompts import build_from_source

with snakemake_job(snakemake) as log:
    source = dict(snakemake.params.source)
    # Datasets end on the answer being imitated, so their trailing assistant turn goes by default.
    default_strip = True if source["type"] == "hf" else snakemake.params.strip_trailing_assistant
    strip = source.pop("strip_trailing_assistant", default_strip)
    stats = build_from_source(
        source, Path(snakemake.output.prompts), seed=snakemake.params.seed, strip_trailing_assistant=strip
    )
    log.info("%s: %s", snakemake.output.prompts, stats)
