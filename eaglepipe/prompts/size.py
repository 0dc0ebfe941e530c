"""A prompt's size as the API receives it, for estimates made without the target's tokenizer."""

from __future__ import annotations

import json

from eaglepipe.prompts.records import PromptRecord


def prompt_json_bytes(prompt: PromptRecord) -> int:
    """The prompt's size as sent (its messages and tools as compact JSON), where no tokenizer counts it."""
    body = {"messages": prompt["messages"], "tools": prompt.get("tools")}
    return len(json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode("utf-8"))
