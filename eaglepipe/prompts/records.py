"""The prompt-set file, `{paths.prompts}/{ds}.jsonl` (docs/formats.md): its record, its writer and the one
reader every later stage reads it through."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import NotRequired, TypedDict

from eaglepipe.io import atomic_write, json_lines
from eaglepipe.messages import Message, Tool
from eaglepipe.prompts.validate import PromptError


class PromptRecord(TypedDict):
    """One prompt: its id (given in the source, or the hash of its content), the chat so far, its tools."""

    id: str
    messages: list[Message]
    tools: NotRequired[list[Tool]]


def write_prompt_set(records: Iterable[PromptRecord], path: Path) -> None:
    """Write atomically, so a killed job never leaves a half-written set that looks finished."""
    lines = [json.dumps(record, ensure_ascii=False, separators=(",", ":")) + "\n" for record in records]
    atomic_write(path, lambda tmp: tmp.write_text("".join(lines), encoding="utf-8"))


def read_prompt_set(path: Path) -> list[PromptRecord]:
    """The prompts rule wrote this file, so a malformed line means a stale or hand-edited set."""
    prompts: list[PromptRecord] = []

    def not_json(number: int) -> PromptError:
        return PromptError(f"{path} line {number} is not JSON: rebuild the prompt set")

    for number, prompt in json_lines(path, not_json):
        if not isinstance(prompt, dict) or not isinstance(prompt.get("id"), str):
            raise PromptError(f"{path} line {number} has no string `id`: rebuild the prompt set")
        if not isinstance(prompt.get("messages"), list) or not prompt["messages"]:
            raise PromptError(f"{path} prompt {prompt['id']} has no messages: rebuild the prompt set")
        prompts.append(prompt)  # type: ignore[arg-type]  # checked above, key by key
    return prompts
