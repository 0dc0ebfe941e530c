"""The response record: one line of `results/{ds}/responses.jsonl` and of the generation journal
(`.journal/records.jsonl`), in the format docs/formats.md describes, whatever the set's source (bought,
the team's engine, an import file). Its writer, and the one reader every later stage reads it through.
It sits below the stages (tests/test_layers.py): generation and the answer sources write it, the token
stage, which generation's usability probe runs, reads it.

Every writer (the generation client, the answers rebuilt from `/generation/content`, the import) writes
each required key; `source` is absent from records written before sources existed (and from rebuilt
answers: they are `openrouter`), `recovered_content` from all but rebuilt answers. The reader checks only
what is cheap and what every reader indexes: a JSON object with a string `prompt_id`, whose `request`,
`response` and `usage` are objects where present. Files made by hand (the tests', a user's) may lack the
other keys, so readers of anything but `prompt_id` keep to `.get`.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, NotRequired, TypedDict

from eaglepipe.chat_api import ChatRequestFields, Logprobs
from eaglepipe.errors import EaglepipeError
from eaglepipe.io import atomic_write, json_lines
from eaglepipe.messages import ToolCall


class ResponseError(EaglepipeError, ValueError):
    """A responses.jsonl line no stage can read, in one line naming the file and line."""


class ResponseUsage(TypedDict):
    """The bill: counts as the server reported them (None where it did not); `cost` in dollars, None for
    an answer that arrived without one (the ledger holds its price) and for imported answers."""

    prompt_tokens: int | None
    completion_tokens: int | None
    reasoning_tokens: int | None
    cost: float | None


class FinishEvidence(TypedDict):
    """Why a reply that gave no `finish_reason` was judged finished: the shape of its end, and the
    provider's own reason where it sent one."""

    shape: str
    native: NotRequired[str]


class ResponseBody(TypedDict):
    """The answer itself (`response`): the text, and the ids and logprobs where the server returned them."""

    content: str
    reasoning: str | None
    tool_calls: list[ToolCall]
    finish_reason: str
    token_ids: NotRequired[list[int]]
    prompt_token_ids: NotRequired[list[int]]
    logprobs: NotRequired[Logprobs]
    reasoning_details: NotRequired[list[Any]]
    reasoning_encrypted: NotRequired[bool]
    finish_evidence: NotRequired[FinishEvidence]


class ReplyFields(TypedDict):
    """What a reply itself says (the client's `read_reply`, an answer rebuilt from `/generation/content`);
    the caller adds what it asked and how it went."""

    response: ResponseBody
    provider: str | None
    generation_id: NotRequired[str | None]
    usage: ResponseUsage


class ResponseRecord(TypedDict):
    """One answered prompt. `request` is what was asked (the engine's and the import's hold fewer keys
    than a bought set's); `latency_s` and `attempts` are None for answers rebuilt from stored content,
    `attempts` 0 for imported ones."""

    prompt_id: str
    source: NotRequired[str]
    fingerprint: str
    request: ChatRequestFields
    response: ResponseBody
    provider: str | None
    generation_id: str | None
    usage: ResponseUsage
    latency_s: float | None
    attempts: int | None
    recovered_content: NotRequired[bool]


def write_responses(records: Iterable[ResponseRecord], path: Path) -> None:
    """Write atomically, so a killed job never leaves a half-written set that looks finished."""
    lines = "".join(json.dumps(record, ensure_ascii=False) + "\n" for record in records)
    atomic_write(path, lambda tmp: tmp.write_text(lines, encoding="utf-8"))


def record_problem(record: Any) -> str | None:
    """Why `record` (one parsed line) is not a response record, or None: the reader's cheap check."""
    if not isinstance(record, dict) or not isinstance(record.get("prompt_id"), str):
        return "has no string `prompt_id`"
    for key in ("request", "response", "usage"):
        if record.get(key) is not None and not isinstance(record[key], dict):
            return f"has a `{key}` that is not an object"
    return None


def as_response_record(record: Any, where: str) -> ResponseRecord:
    """`record`, checked (`record_problem`); a ResponseError naming `where` if it is not one."""
    problem = record_problem(record)
    if problem is not None:
        raise ResponseError(f"{where} {problem}: this is not a responses.jsonl line; rerun generation")
    checked: ResponseRecord = record
    return checked


def iter_responses(path: Path) -> Iterator[ResponseRecord]:
    """The records of a responses.jsonl, one line at a time (a real run's holds gigabytes of text)."""

    def not_json(number: int) -> ResponseError:
        return ResponseError(f"{path} line {number} is not JSON: rerun generation")

    for number, record in json_lines(path, not_json):
        yield as_response_record(record, f"{path} line {number}")


def read_responses(path: Path) -> list[ResponseRecord]:
    """All records of a responses.jsonl, in its order (prompt order)."""
    return list(iter_responses(path))

