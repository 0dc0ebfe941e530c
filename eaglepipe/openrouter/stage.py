"""The generation stage as the rules see it: settings in, providers.json or responses.jsonl out.

This is where "which API" is decided: `api.base_url: local` starts the bundled emulator serving the
target for the job's own duration (no key); anything else is a real API reached with the key file.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eaglepipe.config import is_local_api, sets_answered_by
from eaglepipe.io import write_json
from eaglepipe.layout import RunLayout
from eaglepipe.openrouter.client import GenerationSummary
from eaglepipe.openrouter.dollars import DollarBudget
from eaglepipe.openrouter.errors import OpenRouterError
from eaglepipe.openrouter.routing import RoutingPolicy, fetch_providers, provider_request
from eaglepipe.openrouter.run import generate_responses
from eaglepipe.openrouter.secrets import ApiKey, read_api_key
from eaglepipe.openrouter.settings import ApiSettings, GenerationSettings
from eaglepipe.tokens.probe import usability_probe

log = logging.getLogger(__name__)


def routing_policy(routing: dict[str, Any], max_tokens: int) -> RoutingPolicy:
    """The validated `routing` section as a policy; an empty allowlist means "no allowlist"."""
    return RoutingPolicy.from_config({**routing, "only": routing["only"] or None, "max_tokens": max_tokens})


@contextmanager
def api_connection(
    api: ApiSettings, emulator_log: Path | None = None, threads: int = 1, max_batch: int | None = None
) -> Iterator[tuple[str, ApiKey | None]]:
    """(base URL, key) for this job; the local emulator lives exactly as long as the `with` block."""
    if not api.local:
        yield api.base_url, read_api_key(api.key_file, api.key_file_env)
        return
    from eaglepipe.emulator.runner import running_emulator

    with running_emulator(
        Path(api.target_path),
        extra_args=[
            "--model-id",
            api.model,
            "--threads",
            str(threads),
            *(["--max-batch", str(max_batch)] if max_batch else []),
            *["--text-like", api.emulator_text_like],
        ],
        log_path=emulator_log,
    ) as base_url:
        yield base_url, None


def write_providers(
    out_path: Path, *, api: ApiSettings, routing: RoutingPolicy, emulator_log: Path | None = None
) -> None:
    with api_connection(api, emulator_log) as (base_url, key):
        providers = fetch_providers(base_url, api.model, key, routing)
    if api.local:
        providers["source"] = "local"  # the emulator's port changes every run; its identity does not
    write_json(out_path, providers)
    log.info("%s: kept %s", out_path, [e["tag"] for e in providers["kept"]])


@dataclass(frozen=True)
class JobSettings:
    """A generate job's settings: what shapes its requests (the rule's `request` param) and how it runs
    (the generation_settings file, an ancient input, so that changing it reruns no finished set)."""

    api: ApiSettings
    routing: dict[str, Any]
    generation: dict[str, Any]

    @classmethod
    def from_params(cls, request: dict[str, Any], settings_path: Path) -> JobSettings:
        if not settings_path.is_file():
            raise OpenRouterError(
                f"{settings_path} is missing (a set answered before it existed is rerun): write it with "
                "`.venv/bin/snakemake generation_settings`, then rerun"
            )
        operational = json.loads(settings_path.read_text())
        return cls(
            api=ApiSettings.from_params(request, operational),
            routing=request["routing"],
            generation={**request["generation"], **operational["generation"]},
        )


def write_job_settings(out_path: Path, operational: dict[str, Any]) -> None:
    write_json(out_path, operational)


def run_generation(
    job: JobSettings,
    *,
    prompts_path: Path,
    providers_path: Path,
    responses_path: Path,
    summary_path: Path,
    journal_dir: Path,
    ledger_dir: Path,
    dataset: str,
    fingerprint: str,
    output_token_budget: int,
    budget_key: Any,
    max_failed_fraction: float,
    emulator_log: Path | None = None,
    threads: int = 1,
) -> GenerationSummary:
    api, gen = job.api, job.generation
    dollars = DollarBudget.from_param(budget_key)
    providers = json.loads(providers_path.read_text())
    if providers.get("model") != api.model:
        raise OpenRouterError(
            f"{providers_path} lists endpoints of {providers.get('model')!r}, not of "
            f"{api.model!r}: refresh it with `.venv/bin/snakemake --forcerun providers`"
        )
    target_dir = Path(api.target_path) if gen["probe_answers"] else None
    policy = routing_policy(job.routing, gen["max_tokens"])
    with (
        probe_loading(target_dir) as probe_future,
        # One batch can hold every request in flight, as a real provider's engine would.
        api_connection(api, emulator_log, threads, max_batch=gen["concurrency"]) as (base_url, key),
    ):
        settings = GenerationSettings.from_sections(
            gen,
            model=api.model,
            base_url=base_url,
            fingerprint=fingerprint,
            kept=providers["kept"],
            provider_obj=provider_request(providers["kept"], policy),
            output_token_budget=output_token_budget,
            usd_budget=dollars.run_usd,
            set_usd_budget=dollars.set_usd,
            max_failed_fraction=max_failed_fraction,
            emulated=api.local,
        )
        probe = probe_future.result()
        summary = generate_responses(
            prompts_path, responses_path, summary_path, journal_dir, ledger_dir, dataset, settings, key,
            probe, dollars, budget_key,
        )
    log.info(
        "%s: %d done (%d resumed, %d truncated at max_tokens %d), %d tokens, $%.4f%s",
        responses_path,
        summary.done,
        summary.resumed,
        summary.truncated,
        gen["max_tokens"],
        summary.completion_tokens,
        summary.dollars,
        " (emulated: nothing bought)" if settings.emulated else "",
    )
    return summary


@contextmanager
def probe_loading(target_dir: Path | None) -> Iterator[Future]:
    """The usability probe, loading in a thread from the start of the block: its tokenizer takes seconds,
    as does the emulator a local run starts meanwhile, and neither needs the other."""
    with ThreadPoolExecutor(max_workers=1) as loader:
        yield loader.submit(lambda: usability_probe(target_dir) if target_dir else None)


def check_key_for_pending_sets(config: dict[str, Any], datasets: list[str], layout: RunLayout) -> None:
    """`onstart`: fail before any job when a set still needs bought answers and there is no usable key."""
    if is_local_api(config):
        return
    bought = sets_answered_by(config, "openrouter", datasets)
    pending = [ds for ds in bought if not layout.responses(ds).is_file()]
    if pending:
        read_api_key(config["api"]["key_file"], config["api"]["key_file_env"])
