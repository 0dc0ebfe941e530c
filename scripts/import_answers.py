"""Snakemake adapter: a prompt set's responses from answers the team already has (source: import)."""

from pathlib import Path

from eaglepipe.answers.imported import import_answers
from eaglepipe.jobs import snakemake_job

with snakemake_job(snakemake):
    import_answers(
        prompts_path=Path(snakemake.input.prompts),
        answers_path=Path(snakemake.input.answers),
        responses_path=Path(snakemake.output.responses),
        summary_path=Path(snakemake.params.summary),
        dataset=snakemake.wildcards.ds,
        output_token_budget=snakemake.params.output_token_budget,
        target_name=snakemake.params.target_name,
    )
