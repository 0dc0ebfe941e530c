"""Snakemake adapter: the configured model's endpoints after the routing policy."""

from pathlib import Path

from eaglepipe.jobs import snakemake_job
from eaglepipe.openrouter.connection import routing_policy, write_providers
from eaglepipe.openrouter.settings import ApiSettings

params = snakemake.params
with snakemake_job(snakemake):
    write_providers(
        Path(snakemake.output.providers),
        api=ApiSettings.from_params(dict(params.items())),
        routing=routing_policy(params.routing, params.max_tokens),
        emulator_log=Path(snakemake.log.emulator) if hasattr(snakemake.log, "emulator") else None,
    )
