"""What the HTTP side needs from whatever produces the answers, with no torch or tokenizer behind it.

Model mode (engine.Engine and text.TokenizerText) and synthetic mode (synthetic.SyntheticEngine and
synthetic.WordText) each provide an engine and a text side, so both are served by one HTTP code path.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, Protocol


@dataclass(frozen=True)
class GenerationRequest:
    """What the engine needs to know; `top_logprobs` None means no logprobs at all.

    `event_tokens` is how many tokens the caller sends together (one SSE event, or the whole answer
    when not streamed): a paced engine wakes once per such group instead of once per token.
    """

    prompt_ids: list[int]
    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    top_logprobs: int | None = None
    event_tokens: int = 1


@dataclass(frozen=True)
class GeneratedToken:
    token_id: int
    logprob: float | None = None
    top: tuple[tuple[int, float], ...] = ()


class EngineError(RuntimeError):
    """Generation failed; the request gets a server error."""


class TokenEngine(Protocol):
    """Streams a completion's tokens; `cancellable` False means a client that leaves is billed in full."""

    stop_id: int
    cancellable: bool
    batches: int
    sequences: int
    largest_batch: int

    def start(self) -> None: ...

    def close(self) -> None: ...

    def stream(self, request: GenerationRequest) -> AsyncIterator[GeneratedToken]: ...


class Decoder(Protocol):
    """Text deltas whose concatenation is the decoded answer."""

    def push(self, token_id: int) -> str: ...

    def flush(self) -> str: ...


class TokenText(Protocol):
    """Messages to prompt ids and ids to text, the way the served model's tokenizer would."""

    def prompt_ids(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> list[int]: ...

    def decode(self, ids: list[int]) -> str: ...

    def decoder(self) -> Decoder: ...

    def token_bytes(self, token_id: int) -> bytes: ...
