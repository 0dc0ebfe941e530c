"""Snakemake adapter: the drafter's README (how to serve it elsewhere) and the target it was trained on."""

import json
from pathlib import Path

from eaglepipe.drafter.export import TargetReference, write_serving_readme
from eaglepipe.jobs import snakemake_job

with snakemake_job(snakemake):
    target = TargetReference(**snakemake.params.target)
    drafter_config = json.loads(Path(snakemake.input.config).read_text())
    write_serving_readme(
        Path(snakemake.output.serving),
        drafter_config,
        target,
        num_steps=snakemake.params.num_speculative_tokens,
    )
    target.write(Path(snakemake.output.target))
