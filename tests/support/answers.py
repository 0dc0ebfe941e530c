"""An engine set answered the way its rule does it: the rule's params from the config, one job description."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from eaglepipe.answers.stage import answer_set, answers_job, write_generation_settings
from eaglepipe.config_types import Config, Source
from eaglepipe.openrouter.fingerprint import engine_fingerprint
from eaglepipe.openrouter.settings import engine_request_params, operational_params


def answer_engine_set(
    config: Config,
    prompts: Path,
    folder: Path,
    *,
    ledger: Path,
    engine_log: Path,
    output_token_budget: int,
) -> dict[str, Any]:
    """`folder`'s responses.jsonl from `prompts` (the settings file beside `folder`); returns the summary."""
    settings = folder.parent / "generation_settings.json"
    write_generation_settings(settings, operational_params(config))
    summary = folder / "responses.summary.json"
    params = {
        "fingerprint": engine_fingerprint(config),
        "settings": str(settings),
        "request": engine_request_params(config),
        "output_token_budget": output_token_budget,
        "max_failed_fraction": 0.0,
        "journal": str(folder / ".journal"),
        "summary": str(summary),
        "ledger": str(ledger),
    }
    job = answers_job(
        Source.ENGINE,
        dataset=folder.name,
        inputs={"prompts": str(prompts)},
        outputs={"responses": str(folder / "responses.jsonl")},
        params=params,
        logs={"engine": str(engine_log)},
    )
    answer_set(job)
    return json.loads(summary.read_text())
