"""One `responses.jsonl` record as the token stage needs it: the text pieces, the bill, any exact ids."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from eaglepipe.errors import EaglepipeError
from eaglepipe.responses import ResponseRecord


class ReplyError(EaglepipeError, ValueError):
    """A record the token stage cannot read, in one line."""


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: str


@dataclass(frozen=True)
class Reply:
    """`reasoning` and `content` are "" when absent; `server_ids` exclude the stop token; `server_prompt_ids`
    are the prompt the server prefilled (generation prompt included)."""

    prompt_id: str
    provider: str
    reasoning: str
    content: str
    tool_calls: tuple[ToolCall, ...]
    truncated: bool
    thinking: bool
    billed_prompt: int | None
    billed_completion: int | None
    reasoning_tokens: int
    server_ids: tuple[int, ...] | None
    logprob_bytes: tuple[bytes, ...] | None
    server_prompt_ids: tuple[int, ...] | None

    @property
    def texts(self) -> list[str]:
        return [self.reasoning, self.content, *(t for c in self.tool_calls for t in (c.id, c.arguments))]

    def text_only(self) -> Reply:
        """The reply as a text-only provider would have returned it: what the round-trip gate rebuilds."""
        return replace(self, server_ids=None, logprob_bytes=None, server_prompt_ids=None)


def thinking_requested(request: Mapping[str, Any]) -> bool:
    """Kimi-K2.5 thinks unless the request turned reasoning off (OpenRouter's `reasoning` object)."""
    reasoning = request.get("reasoning")
    if not isinstance(reasoning, dict):
        return True
    return not (
        reasoning.get("enabled") is False
        or reasoning.get("effort") == "none"
        or reasoning.get("max_tokens") == 0
    )


def parse_reply(record: ResponseRecord, where: str) -> Reply:
    response = record.get("response")
    if not isinstance(response, dict) or not isinstance(record.get("prompt_id"), str):
        raise ReplyError(f"{where}: a record without prompt_id or response; the file is not responses.jsonl")
    usage = record.get("usage") or {}
    reasoning = response.get("reasoning") or ""
    return Reply(
        prompt_id=record["prompt_id"],
        provider=str(record.get("provider") or "unknown"),
        reasoning=reasoning,
        content=response.get("content") or "",
        tool_calls=tuple(
            _tool_call(call, f"{where} prompt {record['prompt_id']}")
            for call in response.get("tool_calls") or []
        ),
        truncated=response.get("finish_reason") == "length",
        thinking=bool(reasoning) or thinking_requested(record.get("request") or {}),
        billed_prompt=_count(usage.get("prompt_tokens")),
        billed_completion=_count(usage.get("completion_tokens")),
        reasoning_tokens=_count(usage.get("reasoning_tokens")) or 0,
        server_ids=_server_ids(response.get("token_ids")),
        logprob_bytes=_logprob_bytes(response.get("logprobs")),
        server_prompt_ids=_server_ids(response.get("prompt_token_ids")),
    )


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _tool_call(call: Any, where: str) -> ToolCall:
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict):
        raise ReplyError(f"{where}: a tool call without a 'function' object; regenerate this prompt")
    arguments = function.get("arguments")
    if not isinstance(arguments, str):
        arguments = json.dumps(arguments, ensure_ascii=False)
    return ToolCall(str(call.get("id") or ""), str(function.get("name") or ""), arguments)


def _server_ids(ids: Any) -> tuple[int, ...] | None:
    if not isinstance(ids, list) or not all(isinstance(i, int) for i in ids):
        return None
    return tuple(ids)


def _logprob_bytes(logprobs: Any) -> tuple[bytes, ...] | None:
    """OpenAI's `logprobs.content[*].bytes`, when every entry has them."""
    entries = logprobs.get("content") if isinstance(logprobs, dict) else None
    if not entries or not all(isinstance(e, dict) and isinstance(e.get("bytes"), list) for e in entries):
        return None
    return tuple(bytes(e["bytes"]) for e in entries)
