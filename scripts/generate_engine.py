"""Snakemake adapter: one prompt set's answers from the team's own engine (resumes from its journal)."""

from pathlib import Path

from eaglepipe.answers.engine_stage import run_engine_generation
from eaglepipe.jobs import snakemake_job

params = snakemake.params
with snakemake_job(snakemake):
    run_engine_generation(
        params.request,
        Path(params.settings),
        prompts_path=Path(snakemake.input.prompts),
        responses_path=Path(snakemake.output.responses),
        summary_path=Path(params.summary),
        journal_dir=Path(params.journal),
        ledger_dir=Path(params.ledger),
        dataset=snakemake.wildcards.ds,
        fingerprint=params.fingerprint,
        output_token_budget=params.output_token_budget,
        max_failed_fraction=params.max_failed_fraction,
        engine_log=Path(snakemake.log.engine),
    )
