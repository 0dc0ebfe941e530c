"""One answers job, whatever answers its set: the paths and limits every source shares, and the source."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol


class AnswerSource(Protocol):
    """Writes the job's `responses.jsonl` and summary, or raises a one-line error leaving both unfinished."""

    def answer(self, job: AnswersJob) -> None: ...


@dataclass(frozen=True, kw_only=True)
class AnswersJob:
    """What one answers job runs with. `output_token_budget` caps the set's completion tokens, whatever
    answers them; the summary sits beside responses.jsonl but is undeclared, so a failed job keeps it."""

    dataset: str
    prompts: Path
    responses: Path
    summary: Path
    output_token_budget: int
    source: AnswerSource
