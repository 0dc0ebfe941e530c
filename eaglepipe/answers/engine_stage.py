"""An engine set's generation as the rule sees it: the same client, journal, resume, concurrency, output-token
budget and progress line as a bought set, against the team's own server; no key, no dollars, no routing."""

from __future__ import annotations

import dataclasses
import json
import logging
import sys
from pathlib import Path
from typing import Any

from eaglepipe.answers.engine import EngineSettings, running_engine
from eaglepipe.openrouter.client import GenerationSummary
from eaglepipe.openrouter.errors import OpenRouterError
from eaglepipe.openrouter.run import generate_responses
from eaglepipe.openrouter.settings import GenerationSettings
from eaglepipe.openrouter.stage import probe_loading

log = logging.getLogger(__name__)


def run_engine_generation(
    request: dict[str, Any],
    settings_path: Path,
    *,
    prompts_path: Path,
    responses_path: Path,
    summary_path: Path,
    journal_dir: Path,
    ledger_dir: Path,
    dataset: str,
    fingerprint: str,
    output_token_budget: int,
    max_failed_fraction: float,
    engine_log: Path,
) -> GenerationSummary:
    """`request` is the rule's answer-shaping param (engine_request_params); `settings_path` the run's
    generation_settings file (concurrency, retries, timeouts, where the engine runs or how it starts)."""
    if not settings_path.is_file():
        raise OpenRouterError(
            f"{settings_path} is missing: write it with `.venv/bin/snakemake generation_settings`"
        )
    operational = json.loads(settings_path.read_text())
    engine = EngineSettings.from_section(operational["engine"])
    if engine.server != request["server"]:
        raise OpenRouterError(
            f"{settings_path} is for a {engine.server} engine, the rule asks {request['server']}: "
            "rerun `.venv/bin/snakemake generation_settings`"
        )
    generation = {**request["generation"], **operational["generation"]}
    target_dir = Path(operational["target_path"])
    with (
        probe_loading(target_dir if generation["probe_answers"] else None) as probe,
        running_engine(
            engine,
            target_path=str(target_dir),
            served_name=request["target"],
            python=sys.executable,
            log_path=engine_log,
        ) as server,
    ):
        log.info("%s: %s engine at %s serving %r", dataset, engine.server, server.base_url, server.model)
        settings = GenerationSettings.from_sections(
            {**generation, "return_token_ids": False, "logprobs": False},
            model=server.model,
            base_url=server.base_url,
            fingerprint=fingerprint,
            kept=[],
            provider_obj=None,
            output_token_budget=output_token_budget,
            usd_budget=None,
            max_failed_fraction=max_failed_fraction,
        )
        stream = settings.stream if server.dialect.stream is None else server.dialect.stream
        settings = dataclasses.replace(
            settings,
            stream=stream,
            source="engine",
            paid=False,
            server_name=engine.server,
            extra_request_fields=server.dialect.request_fields(stream),
        )
        summary = generate_responses(
            prompts_path, responses_path, summary_path, journal_dir, ledger_dir, dataset, settings, None,
            probe.result(),
        )
    log.info(
        "%s: %d done (%d resumed, %d truncated at max_tokens %d), %d tokens from the %s engine",
        responses_path,
        summary.done,
        summary.resumed,
        summary.truncated,
        generation["max_tokens"],
        summary.completion_tokens,
        engine.server,
    )
    return summary
