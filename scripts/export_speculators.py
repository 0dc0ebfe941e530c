"""Snakemake adapter: the exported drafter rewritten in vLLM speculators' format."""

from pathlib import Path

from eaglepipe.drafter.speculators import export_speculators
from eaglepipe.jobs import snakemake_job
from eaglepipe.target.architecture import TargetArchitecture

with snakemake_job(snakemake):
    target = TargetArchitecture.from_dir(snakemake.params.target)
    export_speculators(
        Path(snakemake.params.drafter_dir),
        Path(snakemake.params.out_dir),
        verifier=snakemake.params.target,
        verifier_architectures=[target.architecture],
        num_speculative_tokens=snakemake.params.num_speculative_tokens,
    )
