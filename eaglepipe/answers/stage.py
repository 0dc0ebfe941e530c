"""The answers stage as its rules see it: one job description built from the rule, whatever the source."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from eaglepipe.answers.bought import BoughtAnswers
from eaglepipe.answers.engine import EngineAnswers
from eaglepipe.answers.imported import ImportedAnswers
from eaglepipe.answers.job import AnswersJob, AnswerSource
from eaglepipe.config_types import Source
from eaglepipe.io import write_json
from eaglepipe.openrouter.settings import OperationalParams

# How each source reads what its rule adds: (input, params, log, threads) -> the source.
SOURCES: dict[
    Source, Callable[[Mapping[str, Any], Mapping[str, Any], Mapping[str, Any], int], AnswerSource]
] = {
    Source.OPENROUTER: BoughtAnswers.from_rule,
    Source.ENGINE: EngineAnswers.from_rule,
    Source.IMPORT: ImportedAnswers.from_rule,
}


def answers_job(
    source: Source,
    *,
    dataset: str,
    inputs: Mapping[str, Any],
    outputs: Mapping[str, Any],
    params: Mapping[str, Any],
    logs: Mapping[str, Any],
    threads: int = 1,
) -> AnswersJob:
    """The job a rule describes (`rules/generate.smk`): its named input, output, params and log."""
    return AnswersJob(
        dataset=dataset,
        prompts=Path(inputs["prompts"]),
        responses=Path(outputs["responses"]),
        summary=Path(params["summary"]),
        output_token_budget=params["output_token_budget"],
        source=SOURCES[source](inputs, params, logs, threads),
    )


def answer_set(job: AnswersJob) -> None:
    job.source.answer(job)


def write_generation_settings(out_path: Path, operational: OperationalParams) -> None:
    """The generation_settings rule: how the asked sets' jobs run (`operational_params`)."""
    write_json(out_path, operational)
