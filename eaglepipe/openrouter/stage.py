"""The generation stage as the rules see it: config in, providers.json or responses.jsonl out.

This is where "which API" is decided: `api.base_url: local` starts the bundled emulator serving the
target for the job's own duration (no key); anything else is a real API reached with the key file.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from eaglepipe.config import is_local_api
from eaglepipe.io import write_json
from eaglepipe.layout import RunLayout
from eaglepipe.openrouter.client import GenerationSettings, GenerationSummary
from eaglepipe.openrouter.errors import OpenRouterError
from eaglepipe.openrouter.routing import RoutingPolicy, dearest_price, fetch_providers, provider_request
from eaglepipe.openrouter.run import generate_responses
from eaglepipe.openrouter.secrets import ApiKey, read_api_key
from eaglepipe.tokens.probe import usability_probe

log = logging.getLogger(__name__)


def routing_policy(config: dict[str, Any]) -> RoutingPolicy:
    routing = dict(config["routing"])
    routing["only"] = routing.get("only") or None  # an empty allowlist means "no allowlist"
    return RoutingPolicy.from_config({**routing, "max_tokens": config["generation"]["max_tokens"]})


@contextmanager
def api_connection(
    config: dict[str, Any], emulator_log: Path | None = None, threads: int = 1
) -> Iterator[tuple[str, ApiKey | None]]:
    """(base URL, key) for this job; the local emulator lives exactly as long as the `with` block."""
    api = config["api"]
    if not is_local_api(config):
        yield api["base_url"], _api_key(config)
        return
    from eaglepipe.emulator.runner import running_emulator

    with running_emulator(
        Path(config["target"]["path"]),
        # One batch can hold every request in flight, as a real provider's engine would.
        extra_args=[
            "--model-id",
            api["model"],
            "--threads",
            str(threads),
            "--max-batch",
            str(config["generation"]["concurrency"]),
            *["--text-like", api["emulator_text_like"]],
        ],
        log_path=emulator_log,
    ) as base_url:
        yield base_url, None


def _api_key(config: dict[str, Any]) -> ApiKey | None:
    """A self-hosted server may need no key: it gets one only when a key file is configured."""
    api = config["api"]
    if api["self_hosted"] and not (api["key_file"] or os.environ.get(api["key_file_env"])):
        return None
    return read_api_key(api["key_file"], api["key_file_env"])


def max_request_usd(endpoints: list[dict[str, Any]], max_tokens: int) -> float:
    """An upper bound on one request's output cost: the dearest kept endpoint at max_tokens."""
    return dearest_price(endpoints, "completion") * max_tokens


def write_providers(config: dict[str, Any], out_path: Path, emulator_log: Path | None = None) -> None:
    """A self-hosted server is its own only endpoint: nothing to list or route, so nothing is asked."""
    if config["api"]["self_hosted"]:
        write_json(
            out_path,
            {
                "model": config["api"]["model"],
                "source": config["api"]["base_url"],
                "self_hosted": True,
                "policy": None,
                "kept": [],
                "dropped": [],
            },
        )
        log.info("%s: self-hosted server, no provider routing", out_path)
        return
    with api_connection(config, emulator_log) as (base_url, key):
        providers = fetch_providers(base_url, config["api"]["model"], key, routing_policy(config))
    if is_local_api(config):
        providers["source"] = "local"  # the emulator's port changes every run; its identity does not
    write_json(out_path, providers)
    log.info("%s: kept %s", out_path, [e["tag"] for e in providers["kept"]])


def run_generation(
    config: dict[str, Any],
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
    usd_budget: float,
    max_failed_fraction: float,
    emulator_log: Path | None = None,
    threads: int = 1,
) -> GenerationSummary:
    gen = config["generation"]
    providers = json.loads(providers_path.read_text())
    if providers.get("model") != config["api"]["model"]:
        raise OpenRouterError(
            f"{providers_path} lists endpoints of {providers.get('model')!r}, not of "
            f"{config['api']['model']!r}: refresh it with `snakemake --forcerun providers`"
        )
    self_hosted = bool(providers.get("self_hosted"))
    target_dir = Path(config["target"]["path"]) if gen["probe_answers"] else None
    with (
        _probe_loading(target_dir) as probe_loading,
        api_connection(config, emulator_log, threads) as (base_url, key),
    ):
        settings = GenerationSettings(
            base_url=base_url,
            model=config["api"]["model"],
            fingerprint=fingerprint,
            max_tokens=gen["max_tokens"],
            sampling={"temperature": gen["temperature"], "top_p": gen["top_p"], "seed": gen["seed"]},
            provider_obj=None if self_hosted else provider_request(providers["kept"], routing_policy(config)),
            allowed_providers=tuple(
                sorted({e["provider_name"] for e in providers["kept"] if e.get("provider_name")})
            ),
            endpoint_tags=tuple(
                (e["provider_name"], e["tag"]) for e in providers["kept"] if e.get("provider_name")
            ),
            breaker_strikes=gen["breaker_strikes"],
            breaker_share=gen["breaker_share"],
            probe_answers=gen["probe_answers"],
            logprobs=gen["logprobs"],
            max_failed_fraction=max_failed_fraction,
            reasoning=gen["reasoning"],
            concurrency=gen["concurrency"],
            max_attempts=gen["max_attempts"],
            request_timeout_s=gen["request_timeout_s"],
            output_token_budget=output_token_budget,
            usd_budget=usd_budget,
            expected_request_usd=max_request_usd(providers["kept"], gen["max_tokens"]),
            prompt_usd_per_token=dearest_price(providers["kept"], "prompt"),
            stream=gen["stream"],
            return_token_ids=gen["return_token_ids"],
            emulated=is_local_api(config),
        )
        probe = probe_loading.result()
        summary = generate_responses(
            prompts_path, responses_path, summary_path, journal_dir, ledger_dir, dataset, settings, key, probe
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
def _probe_loading(target_dir: Path | None) -> Iterator[Future]:
    """The usability probe, loading in a thread from the start of the block: its tokenizer takes seconds,
    as does the emulator a local run starts meanwhile, and neither needs the other."""
    with ThreadPoolExecutor(max_workers=1) as loader:
        yield loader.submit(lambda: usability_probe(target_dir) if target_dir else None)


def check_key_for_pending_sets(config: dict[str, Any], datasets: list[str], layout: RunLayout) -> None:
    """`onstart`: fail before any job when a set still needs paid generation and there is no usable key."""
    if is_local_api(config) or config["api"]["self_hosted"]:
        return
    pending = [ds for ds in datasets if not layout.responses(ds).is_file()]
    if pending:
        read_api_key(config["api"]["key_file"], config["api"]["key_file_env"])
