"""Checking a `/chat/completions` body the way OpenRouter does, before any routing or generation."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, TypedDict

from eaglepipe.emulator.errors import ApiError
from eaglepipe.emulator.providers import FULL_PARAMETERS, Endpoint
from eaglepipe.messages import Message, Tool

# Request fields that count as parameters for `provider.require_parameters`; beyond FULL_PARAMETERS
# the emulator implements none, so an endpoint never lists them and they are silently ignored.
PARAMETER_NAMES = set(FULL_PARAMETERS) | {
    "stop",
    "top_k",
    "min_p",
    "top_a",
    "frequency_penalty",
    "presence_penalty",
    "repetition_penalty",
    "logit_bias",
    "response_format",
    "structured_outputs",
    "parallel_tool_calls",
    "verbosity",
}
_ROLES = {"system", "developer", "user", "assistant", "tool"}


def _bad(message: str) -> ApiError:
    return ApiError(400, message, "invalid_request")


def _number(body: dict[str, Any], key: str, default: float, low: float, high: float) -> float:
    value = body.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float) or not low <= value <= high:
        raise _bad(f"{key} must be a number between {low} and {high}, got {value!r}")
    return float(value)


def _integer(body: dict[str, Any], key: str, low: int, high: int | None = None) -> int | None:
    value = body.get(key)
    if value is None:
        return None
    if (
        isinstance(value, bool)
        or not isinstance(value, int)
        or value < low
        or (high is not None and value > high)
    ):
        limits = f"between {low} and {high}" if high is not None else f"at least {low}"
        raise _bad(f"{key} must be an integer {limits}, got {value!r}")
    return value


def _flag(body: dict[str, Any], key: str) -> bool:
    value = body.get(key, False)
    if value is not None and not isinstance(value, bool):
        raise _bad(f"{key} must be true or false")
    return bool(value)


def _text_content(content: Any, index: int) -> str:
    """Plain-string content; text parts are joined, since the local model reads text only."""
    if content is None or isinstance(content, str):
        return content or ""
    if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text" for p in content):
        return "".join(str(part.get("text", "")) for part in content)
    raise _bad(f"messages[{index}].content must be a string or a list of text parts")


def _messages(body: dict[str, Any]) -> list[Message]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise _bad("messages must be a non-empty list")
    checked: list[Message] = []
    for index, message in enumerate(messages):
        if not isinstance(message, dict) or message.get("role") not in _ROLES:
            raise _bad(f"messages[{index}] must be an object with role one of {sorted(_ROLES)}")
        content = _text_content(message.get("content"), index)
        checked.append({**message, "role": message["role"], "content": content})
    return checked


class Sampling(TypedDict):
    """The sampling settings an endpoint applies (GenerationRequest's fields)."""

    temperature: float
    top_p: float
    seed: int | None
    top_logprobs: int | None


@dataclass(frozen=True)
class ChatRequest:
    model: str
    messages: list[Message]
    tools: list[Tool] | None
    provider: dict[str, Any] | None
    max_tokens: int | None
    temperature: float
    top_p: float
    seed: int | None
    logprobs: bool
    top_logprobs: int | None
    stream: bool
    return_token_ids: bool
    parameters: frozenset[str]
    reasoning: dict[str, Any] | None = None

    @property
    def thinking(self) -> bool:
        """Reasoning is on unless the request turns it off (Kimi-K2.5's providers think by default)."""
        reasoning = self.reasoning or {}
        return reasoning.get("enabled") is not False and reasoning.get("effort") != "none"

    def sampling_on(self, endpoint: Endpoint) -> Sampling:
        """The sampling settings this endpoint applies: a parameter it does not list is ignored."""
        return {
            "temperature": self.temperature if endpoint.supports("temperature") else 1.0,
            "top_p": self.top_p if endpoint.supports("top_p") else 1.0,
            "seed": self.seed if endpoint.supports("seed") else None,
            "top_logprobs": (self.top_logprobs or 0)
            if self.logprobs and endpoint.supports("logprobs")
            else None,
        }


def parse_chat_request(body: Any) -> ChatRequest:
    """A checked request, or the 400 naming the offending field."""
    if not isinstance(body, dict):
        raise _bad("request body must be a JSON object")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise _bad("model is required (a model id from /models)")
    tools = body.get("tools")
    if tools is not None and not (isinstance(tools, list) and all(isinstance(t, dict) for t in tools)):
        raise _bad("tools must be a list of tool objects")
    provider = body.get("provider")
    if provider is not None and not isinstance(provider, dict):
        raise _bad("provider must be an object of routing preferences")
    for key in ("reasoning", "usage", "stream_options"):
        if body.get(key) is not None and not isinstance(body[key], dict):
            raise _bad(f"{key} must be an object")
    max_tokens = _integer(body, "max_tokens", 1)
    if max_tokens is None:
        max_tokens = _integer(body, "max_completion_tokens", 1)
    parameters = {
        ("max_tokens" if k == "max_completion_tokens" else k)
        for k, v in body.items()
        if v is not None and (k in PARAMETER_NAMES or k == "max_completion_tokens")
    }
    return ChatRequest(
        model=model,
        messages=_messages(body),
        tools=tools or None,
        provider=provider,
        max_tokens=max_tokens,
        temperature=_number(body, "temperature", 1.0, 0.0, 2.0),
        top_p=_number(body, "top_p", 1.0, 1e-9, 1.0),
        seed=_integer(body, "seed", -(2**63), 2**64 - 1),
        logprobs=_flag(body, "logprobs"),
        top_logprobs=_integer(body, "top_logprobs", 0, 20),
        stream=_flag(body, "stream"),
        return_token_ids=_flag(body, "return_token_ids"),
        parameters=frozenset(parameters),
        reasoning=body.get("reasoning"),
    )
