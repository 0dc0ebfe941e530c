"""`source: import`: a prompt set answered from a JSONL of finished conversations the team already has (its
own engine, an earlier run, a dataset's replies), written as the `responses.jsonl` a bought set would have,
so the token stage and everything after it read it unchanged.

Each line is one conversation in OpenAI chat form whose last message is the assistant's answer. It answers
the prompt whose id it names, else the prompt whose content id (`prompt_id`) its conversation minus that
answer has. Lines that answer no prompt of the set are counted, not refused: an import file may cover
several sets. A bad line stops the job before anything is written.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypedDict

from eaglepipe.answers.job import AnswersJob
from eaglepipe.chat_api import ChatRequestFields
from eaglepipe.config_types import Source
from eaglepipe.errors import EaglepipeError
from eaglepipe.io import write_json
from eaglepipe.messages import ToolCall
from eaglepipe.prompts.ids import prompt_id
from eaglepipe.prompts.records import PromptRecord, read_prompt_set
from eaglepipe.prompts.validate import PromptError, validate_record
from eaglepipe.responses import ResponseBody, ResponseRecord, ResponseUsage, write_responses

log = logging.getLogger(__name__)

SOURCE = Source.IMPORT.value
FIX = "fix or remove the line, then rerun"
# How many missing prompt ids the summary and the log name; the count says how many there are.
SHOWN_IDS = 5


class AnswerImportError(EaglepipeError, ValueError):
    """An import file line the token stage could not trust, in one line naming `file:line`."""


@dataclass(frozen=True)
class ImportedAnswer:
    """One line's answer: the parts of its `responses.jsonl` record that do not depend on the file's hash."""

    model: str | None
    response: ResponseBody
    usage: ResponseUsage
    # OpenRouter's `reasoning` object the answer was made with, when the line says (`{"enabled": false}`:
    # thinking off); without it the token stage reads the target's default (Kimi-K2.5 thinks).
    reasoning: dict[str, Any] | None = None

    @property
    def completion_tokens(self) -> int | None:
        return self.usage["completion_tokens"]


@dataclass
class _Reading:
    answers: dict[str, ImportedAnswer]
    fingerprint: str
    unmatched_lines: list[int]
    duplicates: int


@dataclass(frozen=True, kw_only=True)
class ImportedAnswers:
    answers: Path
    # The target the answers are recorded as coming from (`target.name`).
    target_name: str

    @classmethod
    def from_rule(
        cls, inputs: Mapping[str, Any], params: Mapping[str, Any], logs: Mapping[str, Any], threads: int
    ) -> ImportedAnswers:
        return cls(answers=Path(inputs["answers"]), target_name=params["target_name"])

    def answer(self, job: AnswersJob) -> None:
        import_answers(
            job.prompts,
            self.answers,
            job.responses,
            job.summary,
            dataset=job.dataset,
            output_token_budget=job.output_token_budget,
            target_name=self.target_name,
        )


class MissingIds(TypedDict):
    count: int
    first_ids: list[str]


class ImportSummary(TypedDict):
    """An imported set's `responses.summary.json` (docs/formats.md)."""

    source: str
    file: str
    fingerprint: str
    requested: int
    done: int
    truncated: int
    completion_tokens: int
    uncounted: int
    dollars: float
    ended_because: str
    message: str
    unmatched: int
    duplicates: int
    missing: MissingIds
    over_budget: int
    notes: dict[str, str]


def import_answers(
    prompts_path: Path,
    answers_path: Path,
    responses_path: Path,
    summary_path: Path,
    *,
    dataset: str,
    output_token_budget: int | None,
    target_name: str,
) -> ImportSummary:
    """Write `responses.jsonl` (answered prompts in prompt-set order) and its summary; returns the summary.
    Prompts the file does not answer are reported, not refused: a team may import part of a set."""
    prompts = read_prompt_set(prompts_path)
    reading = _read_answers(answers_path, prompts)
    if not reading.answers:  # partial is a choice; none at all is the wrong file or the wrong set
        raise AnswerImportError(
            f"{answers_path}: no line answers a prompt of set {dataset} ({len(reading.unmatched_lines)} "
            f"lines match none of its {len(prompts)} prompts by id or content); point "
            f"answers.sets.{dataset}.path at this set's answers"
        )
    records: list[ResponseRecord] = []
    completion_tokens = uncounted = 0
    for prompt in prompts:
        answer = reading.answers.get(prompt["id"])
        if answer is None:
            continue
        count = answer.completion_tokens
        if count is None:
            uncounted += 1
        elif output_token_budget is not None and completion_tokens + count > output_token_budget:
            break
        else:
            completion_tokens += count
        records.append(_record(prompt["id"], answer, reading.fingerprint, target_name))
    missing = [prompt["id"] for prompt in prompts if prompt["id"] not in reading.answers]
    over_budget = len(reading.answers) - len(records)
    ended_because = "token_budget" if over_budget else "import_incomplete" if missing else "all_done"
    summary: ImportSummary = {
        "source": SOURCE,
        "file": str(answers_path),
        "fingerprint": reading.fingerprint,
        "requested": len(prompts),
        "done": len(records),
        "truncated": sum(record["response"]["finish_reason"] == "length" for record in records),
        "completion_tokens": completion_tokens,
        "uncounted": uncounted,
        "dollars": 0.0,
        "ended_because": ended_because,
        "message": _message(ended_because, output_token_budget, over_budget, len(missing)),
        "unmatched": len(reading.unmatched_lines),
        "duplicates": reading.duplicates,
        "missing": {"count": len(missing), "first_ids": missing[:SHOWN_IDS]},
        "over_budget": over_budget,
        "notes": {
            "completion_tokens": "over the answers whose count is known (usage.completion_tokens, else "
            "the number of token_ids); `uncounted` answers have neither: they are taken, outside the budget",
        },
    }
    _warn(dataset, answers_path, summary, missing, reading.unmatched_lines)
    write_json(summary_path, summary)
    write_responses(records, responses_path)
    log.info(
        "%s: %d of %d prompts answered from %s, %d completion tokens (%d answers uncounted), ended by %s",
        responses_path, len(records), len(prompts), answers_path, completion_tokens, uncounted, ended_because,
    )
    return summary


def _read_answers(path: Path, prompts: list[PromptRecord]) -> _Reading:
    """Every line checked (matched or not, so a bad file fails whichever set reads it first); the file's
    sha256 is taken over the same bytes, so the fingerprint is that of exactly what was imported."""
    ids = {prompt["id"] for prompt in prompts}
    by_content = {prompt_id(prompt["messages"], prompt.get("tools")): prompt["id"] for prompt in prompts}
    digest = hashlib.sha256()
    answers: dict[str, ImportedAnswer] = {}
    unmatched: list[int] = []
    duplicates = 0
    with open(path, "rb") as handle:
        for number, raw in enumerate(handle, start=1):
            digest.update(raw)
            where = f"{path}:{number}"
            line = _parse_line(raw, where)
            if line is None:
                continue
            answer = _answer(line, where)
            matched = _match(line, ids, by_content, where)
            if matched is None:
                unmatched.append(number)
            elif matched in answers:
                duplicates += 1
            else:
                answers[matched] = answer
    return _Reading(answers, digest.hexdigest(), unmatched, duplicates)


def _parse_line(raw: bytes, where: str) -> dict[str, Any] | None:
    """The line's object, or None for a blank line."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise AnswerImportError(f"{where}: not UTF-8 text; {FIX}") from None
    if not text.strip():
        return None
    try:
        line = json.loads(text)
    except ValueError:
        raise AnswerImportError(f"{where}: not a JSON object; {FIX}") from None
    if not isinstance(line, dict):
        raise AnswerImportError(f"{where}: a JSON {type(line).__name__}, not an object; {FIX}")
    messages = line.get("messages")
    if not isinstance(messages, list) or not messages:
        raise AnswerImportError(
            f"{where}: no `messages` list ending on the assistant's answer; {FIX}"
        )
    return line


def _match(line: dict[str, Any], ids: set[str], by_content: dict[str, str], where: str) -> str | None:
    """The prompt this line answers: the one its `id` names, else the one its conversation is; a
    conversation that is no valid prompt (it ends on an assistant turn, has an image part) is none."""
    given = line.get("id")
    if isinstance(given, str) and given in ids:
        return given
    conversation = line["messages"][:-1]
    if not conversation:
        return None
    try:
        asked = {"messages": conversation, "tools": line.get("tools")}
        prompt = validate_record(asked, where=where, strip_trailing_assistant=False)
    except PromptError:
        return None
    return by_content.get(prompt_id(prompt["messages"], prompt.get("tools")))


def _answer(line: dict[str, Any], where: str) -> ImportedAnswer:
    message = line["messages"][-1]
    if not isinstance(message, dict) or message.get("role") != "assistant":
        role = message.get("role") if isinstance(message, dict) else type(message).__name__
        raise AnswerImportError(
            f"{where}: the last message is {role!r}, not the assistant's answer; {FIX}"
        )
    content = _text(message.get("content"), "content", where)
    reasoning = _text(message.get("reasoning_content") or message.get("reasoning"), "reasoning", where)
    tool_calls = _tool_calls(message.get("tool_calls"), where)
    if not (content or reasoning or tool_calls):
        raise AnswerImportError(
            f"{where}: the last message has no content, reasoning or tool_calls, so it answers nothing; {FIX}"
        )
    finish_reason = line.get("finish_reason") or "stop"
    if not isinstance(finish_reason, str):
        raise AnswerImportError(f'{where}: `finish_reason` must be a string ("stop", "length", ...); {FIX}')
    response: ResponseBody = {
        "content": content or "",
        "reasoning": reasoning,
        "tool_calls": tool_calls,
        "finish_reason": finish_reason,
    }
    if line.get("token_ids") is not None:
        response["token_ids"] = _token_ids(line["token_ids"], "token_ids", where)
    if line.get("prompt_token_ids") is not None:
        response["prompt_token_ids"] = _token_ids(line["prompt_token_ids"], "prompt_token_ids", where)
    usage = line.get("usage")
    if usage is not None and not isinstance(usage, dict):
        raise AnswerImportError(f"{where}: `usage` must be an object of token counts; {FIX}")
    completion = _count(usage, "completion_tokens", where)
    if completion is None and "token_ids" in response:
        completion = len(response["token_ids"])
    model = line.get("model")
    asked = line.get("reasoning")
    if asked is not None and not isinstance(asked, dict):
        raise AnswerImportError(
            f"{where}: `reasoning` must be an object such as {{\"enabled\": false}}; {FIX}"
        )
    return ImportedAnswer(
        reasoning=asked,
        model=model if isinstance(model, str) and model else None,
        response=response,
        usage={
            "prompt_tokens": _count(usage, "prompt_tokens", where),
            "completion_tokens": completion,
            "reasoning_tokens": None,
            "cost": None,
        },
    )


def _text(value: Any, key: str, where: str) -> str | None:
    if value is None or isinstance(value, str):
        return value or None
    raise AnswerImportError(f"{where}: the answer's `{key}` must be a string or null, not "
                            f"{type(value).__name__}; {FIX}")


def _tool_calls(calls: Any, where: str) -> list[ToolCall]:
    """OpenAI's shape, with arguments as the JSON string OpenAI sends (an object is dumped to one)."""
    if calls is None:
        return []
    if not isinstance(calls, list):
        raise AnswerImportError(f"{where}: the answer's `tool_calls` must be a list; {FIX}")
    out: list[ToolCall] = []
    for call in calls:
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise AnswerImportError(
                f'{where}: a tool call without {{"function": {{"name", "arguments"}}}}; {FIX}'
            )
        arguments = function.get("arguments", "")
        if not isinstance(arguments, str):
            arguments = json.dumps(arguments, ensure_ascii=False)
        out.append({
            "id": str(call.get("id") or ""),
            "type": "function",
            "function": {"name": function["name"], "arguments": arguments},
        })
    return out


def _token_ids(ids: Any, key: str, where: str) -> list[int]:
    if not isinstance(ids, list) or not all(_is_count(i) for i in ids):
        raise AnswerImportError(
            f"{where}: `{key}` must be a list of token ids (non-negative integers); {FIX}"
        )
    return ids


def _count(usage: dict[str, Any] | None, key: str, where: str) -> int | None:
    value = (usage or {}).get(key)
    if value is None or _is_count(value):
        return value
    raise AnswerImportError(f"{where}: `usage.{key}` must be a non-negative integer or null; {FIX}")


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _record(prompt: str, answer: ImportedAnswer, fingerprint: str, target_name: str) -> ResponseRecord:
    """The `responses.jsonl` record of docs/formats.md, marked `source: import`; nothing was requested, so
    `request` holds only the model that answered and, when the line says, the reasoning it was made with."""
    request: ChatRequestFields = {"model": answer.model or target_name}
    if answer.reasoning is not None:
        request["reasoning"] = answer.reasoning
    return {
        "source": SOURCE,
        "prompt_id": prompt,
        "fingerprint": fingerprint,
        "request": request,
        "response": answer.response,
        "provider": SOURCE,
        "generation_id": None,
        "usage": answer.usage,
        "latency_s": None,
        "attempts": 0,
    }


def _message(ended_because: str, budget: int | None, over_budget: int, missing: int) -> str:
    if ended_because == "token_budget":
        return f"output token budget {budget} reached; {over_budget} imported answers left out"
    if ended_because == "import_incomplete":
        return f"the import file has no answer for {missing} prompts of the set"
    return ""


def _warn(
    dataset: str, path: Path, summary: ImportSummary, missing: list[str], unmatched: list[int]
) -> None:
    """Neither fails the job (a team may import part of a set, or one file for several sets), so the log
    says it where the user reads it."""
    if missing:
        log.warning(
            "set %s: %s has no answer for %d of %d prompts (first: %s); the set goes on without them",
            dataset, path, len(missing), summary["requested"], ", ".join(missing[:SHOWN_IDS]),
        )
    if unmatched:
        log.warning(
            "set %s: %d lines of %s answer no prompt of the set (first lines: %s)",
            dataset, len(unmatched), path, ", ".join(map(str, unmatched[:SHOWN_IDS])),
        )
