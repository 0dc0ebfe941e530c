"""Snakemake adapter: token ids and loss masks of one prompt set."""

from pathlib import Path

from eaglepipe.jobs import snakemake_job
from eaglepipe.tokens.build import build_tokens
from eaglepipe.tokens.rebuild import TokenSettings

with snakemake_job(snakemake) as log:
    stats = build_tokens(
        Path(snakemake.input.prompts),
        Path(snakemake.input.responses),
        Path(snakemake.params.target),
        Path(snakemake.output.tokens),
        Path(snakemake.output.stats),
        TokenSettings.from_section(snakemake.params.settings),
    )
    log.info("%s: %s %s %s", snakemake.output.tokens, stats["counts"], stats["shares"], stats["billed"])
