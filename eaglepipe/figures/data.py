"""What the figures and the end-of-run table read: the stages' own outputs, named by path, never searched for.

A file that does not exist yet (a run stopped early, a set not built) is simply absent from the result, so
the end-of-run table can show a partial run; the figures rule declares every file it needs as an input.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from eaglepipe.hidden.storage import bytes_per_token
from eaglepipe.openrouter.ledger import BilledLine, read_billed
from eaglepipe.responses import iter_responses
from eaglepipe.tokens.token_file import TokenStats, read_token_stats

if TYPE_CHECKING:  # the figures import no torch
    from eaglepipe.drafter.evaluate import EvalReport
    from eaglepipe.drafter.train import TrainReport
    from eaglepipe.hidden.extract import HiddenManifest


@dataclass(frozen=True)
class Answer:
    """What the figures need of one response: a real run's responses.jsonl holds gigabytes of text."""

    completion_tokens: int | None  # None: an answer without a count (an imported one, say)
    finish_reason: str


@dataclass
class SetOutputs:
    """One prompt set's outputs; None where the stage has not written them."""

    name: str
    answers: list[Answer] | None = None  # from responses.jsonl, one per answer
    summary: dict[str, Any] | None = None  # responses.summary.json
    tokens: TokenStats | None = None  # tokens.json
    hidden: HiddenManifest | None = None  # hidden.done

    @property
    def token_stats(self) -> Mapping[str, Any]:
        """`tokens`, or nothing before the token stage; read with `.get`: only `prompt_ids` is checked."""
        return self.tokens or {}


@dataclass
class RunOutputs:
    sets: list[SetOutputs]
    ledger: list[BilledLine] = field(default_factory=list)  # billed lines of the run-wide ledger
    train: TrainReport | None = None  # drafter/train.json
    eval: EvalReport | None = None  # drafter/eval.json


def read_json(path: Path | None) -> Any:
    """The file's JSON, or None where it does not exist yet; the fields it fills say what it holds."""
    return json.loads(path.read_text()) if path is not None and path.is_file() else None


def _read_stats(path: Path | None) -> TokenStats | None:
    return read_token_stats(path) if path is not None and path.is_file() else None


def read_answers(path: Path | None) -> list[Answer] | None:
    """Each response's completion tokens (billed, or the imported answer's count) and finish reason, read one
    line at a time."""
    if path is None or not path.is_file():
        return None
    return [
        Answer(
            completion_tokens=(record.get("usage") or {}).get("completion_tokens"),
            finish_reason=(record.get("response") or {}).get("finish_reason") or "none",
        )
        for record in iter_responses(path)
    ]


def load_run(
    datasets: list[str],
    *,
    responses: list[Path] | None = None,
    summaries: list[Path] | None = None,
    token_stats: list[Path] | None = None,
    manifests: list[Path] | None = None,
    ledger_dir: Path | None = None,
    train: Path | None = None,
    evaluation: Path | None = None,
) -> RunOutputs:
    """Each list goes set by set, in the order of `datasets`; a list left out is not read."""

    def nth(paths: list[Path] | None, index: int) -> Path | None:
        return Path(paths[index]) if paths else None

    sets = [
        SetOutputs(
            name=name,
            answers=read_answers(nth(responses, i)),
            summary=read_json(nth(summaries, i)),
            tokens=_read_stats(nth(token_stats, i)),
            hidden=read_json(nth(manifests, i)),
        )
        for i, name in enumerate(datasets)
    ]
    return RunOutputs(
        sets=sets,
        ledger=read_billed(Path(ledger_dir)) if ledger_dir else [],
        train=read_json(Path(train) if train else None),
        eval=read_json(Path(evaluation) if evaluation else None),
    )


def hidden_bytes(manifest: HiddenManifest) -> int:
    """Shard disk from the manifest alone."""
    return manifest["num_tokens"] * bytes_per_token(manifest["hidden_size"], manifest["dtype"])
