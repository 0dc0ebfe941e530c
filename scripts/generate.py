"""Snakemake adapter: the target's responses for one prompt set (resumes from its journal)."""

from pathlib import Path

from eaglepipe.jobs import snakemake_job
from eaglepipe.openrouter.stage import JobSettings, run_generation

with snakemake_job(snakemake):
    run_generation(
        JobSettings.from_params(snakemake.params.request, Path(snakemake.params.settings)),
        prompts_path=Path(snakemake.input.prompts),
        providers_path=Path(snakemake.input.providers),
        responses_path=Path(snakemake.output.responses),
        summary_path=Path(snakemake.params.summary),
        journal_dir=Path(snakemake.params.journal),
        ledger_dir=Path(snakemake.params.ledger),
        dataset=snakemake.wildcards.ds,
        fingerprint=snakemake.params.fingerprint,
        output_token_budget=snakemake.params.output_token_budget,
        budget_key=snakemake.params.budget_key,
        max_failed_fraction=snakemake.params.max_failed_fraction,
        emulator_log=Path(snakemake.log.emulator) if hasattr(snakemake.log, "emulator") else None,
        threads=snakemake.threads,
    )
