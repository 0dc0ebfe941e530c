"""A generated completion, what it costs, and the OpenRouter bodies that report it."""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, TypedDict

from eaglepipe.chat_api import (
    ChatCompletion,
    Choice,
    FinishReason,
    GenerationRecord,
    Logprobs,
    MessageFields,
    StreamChoice,
    StreamDelta,
    TokenLogprob,
    TopLogprob,
    Usage,
)
from eaglepipe.emulator.backend import GeneratedToken
from eaglepipe.emulator.providers import Endpoint


def new_generation_id() -> str:
    return "gen-" + secrets.token_urlsafe(18)


class FinishFields(TypedDict):
    """How an answer says it finished: OpenAI's name for it, and the provider's own."""

    finish_reason: str | None
    native_finish_reason: str | None


def said_finish(reason: str | None) -> FinishFields:
    """Both as OpenAI names the finish."""
    return {"finish_reason": reason, "native_finish_reason": reason}


@dataclass
class Completion:
    """One request's generation; its counts follow the endpoint's billing convention.

    `complete`: the engine produced the whole answer; `cancelled`: the client left before its end
    (both hold for a provider that cannot cancel); `failed`: it ended in an error; `calls_tools`: the
    provider returned tool calls, so a stop is reported as `tool_calls`; `reasoning_tokens`: how many of
    the ids were reasoning, as usage reports it (a Kimi answer; 0 for plain text). `reports_usage` and
    `reports_cost` off leave the answer without usage or with `cost: null`, and `says_finish` reports a
    stop or length in a provider's own way (both for injected faults); the bill and `/generation` are
    unchanged. `thinking` and `tool_history` (the calls made earlier in the conversation)
    are what a Kimi-layout reply shape needs to split the ids as the provider's parser would.
    """

    model_id: str
    endpoint: Endpoint
    prompt_ids: list[int]
    stop_id: int
    streamed: bool
    thinking: bool = False
    tool_history: int = 0
    id: str = field(default_factory=new_generation_id)
    created: int = field(default_factory=lambda: int(time.time()))
    started: float = field(default_factory=time.monotonic)
    tokens: list[GeneratedToken] = field(default_factory=list)
    first_token_s: float | None = None
    finished_s: float | None = None
    complete: bool = False
    cancelled: bool = False
    failed: bool = False
    calls_tools: bool = False
    reasoning_tokens: int = 0
    reports_usage: bool = True
    reports_cost: bool = True
    says_finish: Callable[[str], FinishFields] = field(default=said_finish)

    def add(self, token: GeneratedToken) -> None:
        if self.first_token_s is None:
            self.first_token_s = time.monotonic() - self.started
        self.tokens.append(token)

    @property
    def stopped(self) -> bool:
        return bool(self.tokens) and self.tokens[-1].token_id == self.stop_id

    @property
    def answer_tokens(self) -> list[GeneratedToken]:
        return self.tokens[:-1] if self.stopped else self.tokens

    @property
    def completion_ids(self) -> list[int]:
        """The answer's ids, the stop token excluded (what `token_ids` returns)."""
        return [t.token_id for t in self.answer_tokens]

    @property
    def finish_reason(self) -> FinishReason | None:
        if self.failed:
            return "error"
        if not self.complete and not self.stopped:
            return None
        if not self.stopped:
            return "length"
        return "tool_calls" if self.calls_tools else "stop"

    def finish_fields(self, reason: str | None) -> FinishFields:
        """`finish_reason` and `native_finish_reason` as this answer's provider reports `reason`."""
        if reason is None or reason == "error":
            return said_finish(reason)
        return self.says_finish(reason)

    @property
    def prompt_tokens(self) -> int:
        return len(self.prompt_ids)

    @property
    def completion_tokens(self) -> int:
        """Counted, not listed: billing asks this several times per answer."""
        return len(self.tokens) - int(self.stopped and not self.endpoint.bills_stop_token)

    @property
    def billed(self) -> bool:
        """OpenRouter charges nothing for a response that failed or has no tokens."""
        return self.completion_tokens > 0 and not self.failed

    def costs(self) -> tuple[float, float, float]:
        """(prompt, completion, total) USD."""
        if not self.billed:
            return 0.0, 0.0, 0.0
        prompt = self.prompt_tokens * self.endpoint.price("prompt")
        completion = self.completion_tokens * self.endpoint.price("completion")
        return prompt, completion, prompt + completion + self.endpoint.price("request")

    def usage(self) -> Usage:
        prompt_cost, completion_cost, cost = self.costs()
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
            "cost": cost if self.reports_cost else None,
            "is_byok": False,
            "prompt_tokens_details": {"cached_tokens": 0},
            "completion_tokens_details": {"reasoning_tokens": self.reasoning_tokens},
            "cost_details": {
                "upstream_inference_cost": None,
                "upstream_inference_prompt_cost": prompt_cost,
                "upstream_inference_completions_cost": completion_cost,
            },
        }

    def header(self, obj: str) -> dict[str, str | int | None]:
        header: dict[str, str | int | None] = {
            "id": self.id,
            "provider": self.endpoint.answer_name,
            "model": self.model_id,
            "object": obj,
            "created": self.created,
        }
        # As OpenRouter documents it: a whole answer always has one (string or null), a chunk a string or
        # none at all. The emulator has no fingerprint to give.
        return {**header, "system_fingerprint": None} if obj == "chat.completion" else header

    def body(self, message: MessageFields, logprobs: Logprobs | None, with_token_ids: bool) -> ChatCompletion:
        """The non-streamed `/chat/completions` answer; `message` holds the assistant message's fields."""
        choice: Choice = {
            "index": 0,
            "logprobs": logprobs,
            **self.finish_fields(self.finish_reason),
            "message": {"role": "assistant", "content": "", "refusal": None, "reasoning": None, **message},
        }
        # The header's fields, spelt out: as OpenRouter documents it, a whole answer always has a
        # `system_fingerprint` (string or null).
        body: ChatCompletion = {
            "id": self.id,
            "provider": self.endpoint.answer_name,
            "model": self.model_id,
            "object": "chat.completion",
            "created": self.created,
            "system_fingerprint": None,
            "choices": [choice],
        }
        if self.reports_usage:
            body["usage"] = self.usage()
        if with_token_ids:
            choice["token_ids"] = self.completion_ids
            body["prompt_token_ids"] = self.prompt_ids
        return body

    def chunk(
        self,
        delta: StreamDelta,
        *,
        finish: bool = False,
        logprobs: Logprobs | None = None,
        token_ids: list[int] | None = None,
    ) -> dict[str, Any]:
        """One streamed chunk carrying `delta` (content, reasoning, tool-call fragments); `finish` marks the
        last one. A StreamChunk, left as a plain dict for the stream writer, which adds the prompt's ids
        to the first."""
        choice: StreamChoice = {
            "index": 0,
            "delta": {"role": "assistant", **delta},
            **self.finish_fields(self.finish_reason if finish else None),
            "logprobs": logprobs,
        }
        if token_ids is not None:
            choice["token_ids"] = token_ids
        return {**self.header("chat.completion.chunk"), "choices": [choice]}

    def usage_chunk(self) -> dict[str, Any]:
        """The last chunk: usage and empty `choices`."""
        return {**self.header("chat.completion.chunk"), "choices": [], "usage": self.usage()}

    def error_chunk(self, error: dict[str, Any]) -> dict[str, Any]:
        """A failure inside a stream: a top-level `error` and `finish_reason: "error"`."""
        choices = [{"index": 0, "delta": {"content": ""}, "finish_reason": "error"}]
        return {**self.header("chat.completion.chunk"), "error": error, "choices": choices}

    def generation_record(self) -> GenerationRecord:
        """What `GET /generation?id=` answers, in its `data`."""
        _, _, cost = self.costs()
        elapsed_ms = (self.finished_s or 0.0) * 1000.0
        return {
            "id": self.id,
            "upstream_id": self.id,
            "total_cost": cost,
            "usage": cost,
            "cache_discount": None,
            "upstream_inference_cost": None,
            "created_at": datetime.fromtimestamp(self.created, UTC).isoformat(),
            "model": self.model_id,
            "provider_name": self.endpoint.answer_name,
            "app_id": None,
            "streamed": self.streamed,
            "cancelled": self.cancelled,
            "latency": (self.first_token_s or 0.0) * 1000.0,
            "moderation_latency": None,
            "generation_time": elapsed_ms,
            "finish_reason": self.finish_reason,
            "native_finish_reason": self.finish_reason,
            "tokens_prompt": self.prompt_tokens,
            "tokens_completion": self.completion_tokens,
            "native_tokens_prompt": self.prompt_tokens,
            "native_tokens_completion": self.completion_tokens,
            "native_tokens_completion_images": 0,
            "native_tokens_reasoning": self.reasoning_tokens,
            "native_tokens_cached": 0,
            "num_media_prompt": 0,
            "num_input_audio_prompt": 0,
            "num_media_completion": 0,
            "num_search_results": 0,
            "num_fetches": 0,
            "web_search_engine": None,
            "origin": "",
            "is_byok": False,
            "external_user": None,
            "api_type": "completions",
            "preset_id": None,
            "router": None,
            "provider_responses": None,
            "user_agent": None,
            "http_referer": None,
            "data_region": "global",
            "workspace_id": None,
            "service_tier": None,
        }


def logprobs_body(tokens: list[GeneratedToken], token_bytes: Callable[[int], bytes]) -> Logprobs:
    """OpenAI's `logprobs` object: per answer token its text, UTF-8 bytes and alternatives."""

    def entry(token_id: int, logprob: float) -> TopLogprob:
        raw = token_bytes(token_id)
        return {"token": raw.decode("utf-8", errors="replace"), "bytes": list(raw), "logprob": logprob}

    content: list[TokenLogprob] = [
        {**entry(t.token_id, t.logprob), "top_logprobs": [entry(i, lp) for i, lp in t.top]}
        for t in tokens
        if t.logprob is not None
    ]
    return {"content": content, "refusal": None}
