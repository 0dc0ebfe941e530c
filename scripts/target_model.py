"""Snakemake adapter: build the embedded target's HF directory from its packaged GGUF file."""

from pathlib import Path

from eaglepipe.jobs import snakemake_job
from eaglepipe.target.convert import EMBEDDED_GGUF, convert_gguf, packaged_gguf

with snakemake_job(snakemake):
    convert_gguf(packaged_gguf(*EMBEDDED_GGUF), Path(snakemake.output.model))
