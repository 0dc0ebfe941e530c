"""Snakemake adapter: one prompt set's answers, from the source its rule names (resumes from its journal)."""

from eaglepipe.answers.stage import answer_set, answers_job
from eaglepipe.jobs import snakemake_job

with snakemake_job(snakemake):
    answer_set(
        answers_job(
            snakemake.params.source,
            dataset=snakemake.wildcards.ds,
            inputs=dict(snakemake.input.items()),
            outputs=dict(snakemake.output.items()),
            params=dict(snakemake.params.items()),
            logs=dict(snakemake.log.items()),
            threads=snakemake.threads,
        )
    )
