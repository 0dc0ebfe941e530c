"""Snakemake adapter: the exported drafter rewritten in vLLM speculators' format, its target named alike."""

from pathlib import Path

from eaglepipe.drafter.export import TargetReference
from eaglepipe.drafter.speculators import export_speculators
from eaglepipe.jobs import snakemake_job
from eaglepipe.target.architecture import TargetArchitecture

with snakemake_job(snakemake):
    target = TargetReference.read(Path(snakemake.input.target))
    export_speculators(
        Path(snakemake.params.drafter_dir),
        Path(snakemake.params.out_dir),
        target=target,
        verifier_architectures=[TargetArchitecture.from_dir(snakemake.params.target).architecture],
        num_speculative_tokens=snakemake.params.num_speculative_tokens,
    )
    target.write(Path(snakemake.output.target))
