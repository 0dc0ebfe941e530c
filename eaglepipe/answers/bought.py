"""`source: openrouter`: a set's answers bought through OpenRouter, or through the bundled emulator standing
in for it (`api.base_url: local`), from the endpoints routing kept (providers.json), under the run's
dollars."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eaglepipe.answers.asked import AskedSet, ask_server, probe_loading
from eaglepipe.answers.job import AnswersJob
from eaglepipe.openrouter.connection import api_connection, read_providers, routing_policy
from eaglepipe.openrouter.dollars import DollarBudget
from eaglepipe.openrouter.errors import OpenRouterError
from eaglepipe.openrouter.routing import provider_request
from eaglepipe.openrouter.settings import ApiSettings, GenerationSettings, JobGeneration, RequestParams


@dataclass(frozen=True, kw_only=True)
class BoughtAnswers:
    asked: AskedSet
    request: RequestParams
    api: ApiSettings
    providers: Path
    dollar_budget: DollarBudget
    # The local emulator's log and threads (unused against a real API).
    emulator_log: Path | None
    threads: int

    @classmethod
    def from_rule(
        cls, inputs: Mapping[str, Any], params: Mapping[str, Any], logs: Mapping[str, Any], threads: int
    ) -> BoughtAnswers:
        asked, request = AskedSet.from_rule(params), params["request"]
        return cls(
            asked=asked,
            request=request,
            api=ApiSettings.from_params({**request, **asked.operational}),
            providers=Path(inputs["providers"]),
            dollar_budget=DollarBudget.from_param(params["dollar_budget"]),
            emulator_log=Path(logs["emulator"]) if "emulator" in logs else None,
            threads=threads,
        )

    def answer(self, job: AnswersJob) -> None:
        api, asked = self.api, self.asked
        gen: JobGeneration = {**self.request["generation"], **asked.operational["generation"]}
        providers = read_providers(self.providers)
        if providers.get("model") != api.model:
            raise OpenRouterError(
                f"{self.providers} lists endpoints of {providers.get('model')!r}, not of "
                f"{api.model!r}: refresh it with `.venv/bin/snakemake --forcerun providers`"
            )
        policy = routing_policy(self.request["routing"], gen["max_tokens"])
        with (
            probe_loading(Path(api.target_path) if gen["probe_answers"] else None) as probe,
            # One batch can hold every request in flight, as a real provider's engine would.
            api_connection(api, self.emulator_log, self.threads, max_batch=gen["concurrency"]) as (
                base_url,
                key,
            ),
        ):
            settings = GenerationSettings.from_sections(
                gen,
                model=api.model,
                base_url=base_url,
                fingerprint=asked.fingerprint,
                kept=providers["kept"],
                provider_obj=provider_request(providers["kept"], policy),
                output_token_budget=job.output_token_budget,
                dollar_budget=self.dollar_budget,
                max_failed_fraction=asked.max_failed_fraction,
                emulated=api.local,
            )
            ask_server(job, asked, settings, key, probe.result())
