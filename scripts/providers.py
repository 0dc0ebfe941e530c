"""Snakemake adapter: the configured model's endpoints after the routing policy."""

from pathlib import Path

from eaglepipe.jobs import snakemake_job
from eaglepipe.openrouter.settings import ApiSettings
from eaglepipe.openrouter.stage import routing_policy, write_providers

params = snakemake.params
with snakemake_job(snakemake):
    write_providers(
        Path(snakemake.output.providers),
        api=ApiSettings(
            model=params.model,
            base_url=params.base_url,
            key_file=params.key_file,
            key_file_env=params.key_file_env,
            emulator_text_like=params.emulator_text_like,
            target_path=params.target_path,
        ),
        routing=routing_policy(params.routing, params.max_tokens),
        emulator_log=Path(snakemake.log.emulator) if hasattr(snakemake.log, "emulator") else None,
    )
