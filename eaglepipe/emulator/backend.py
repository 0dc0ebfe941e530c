"""What the HTTP side needs from whatever produces the answers, with no torch or tokenizer behind it.

Model mode (engine.Engine and text.TokenizerText) and the tests' modes (tests/support/emulator: synthetic
words, the Kimi corpus) each provide an engine and a text side, so all are served by one HTTP code path. A
`ReplyShape` turns an answer's ids into the assistant message and its stream deltas: plain text
(`TextReplies`), or reasoning and tool calls as each endpoint's provider returns them (a Kimi-layout
model's kimi_model.KimiModelReplies, the tests' Kimi mode).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from eaglepipe.chat_api import MessageFields, StreamDelta
from eaglepipe.messages import Message, Tool

if TYPE_CHECKING:
    from eaglepipe.emulator.completion import Completion
    from eaglepipe.emulator.providers import Endpoint


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


class GenerationFailed(RuntimeError):
    """Generation failed inside the emulator: the client gets a server error, as from a real provider."""


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


class PromptText(Protocol):
    """Messages to prompt ids, and a token's bytes (for logprobs): what the app itself asks of a text side.
    `thinking`: the request leaves reasoning on (a target that cannot reason ignores it)."""

    def prompt_ids(
        self, messages: list[Message], tools: list[Tool] | None, *, thinking: bool
    ) -> list[int]: ...

    def token_bytes(self, token_id: int) -> bytes: ...


class TokenText(PromptText, Protocol):
    """Also ids to text, the way the served model's tokenizer would (what `TextReplies` returns)."""

    def decode(self, ids: list[int]) -> str: ...

    def decoder(self) -> Decoder: ...


class DeltaStream(Protocol):
    """A streamed answer's deltas (`delta` objects without `role`), released as its ids arrive."""

    def push(self, ids: list[int]) -> list[StreamDelta]: ...

    def flush(self) -> list[StreamDelta]: ...


class ReplyShape(Protocol):
    """What a provider makes of an answer's ids: the message's fields and the stream's deltas. Either may
    mark the completion as one that ends in tool calls (its finish reason then says so)."""

    def message(self, completion: Completion) -> MessageFields: ...

    def deltas(self, completion: Completion, generation: GenerationRequest) -> DeltaStream: ...

    def returns_token_ids(self, endpoint: Endpoint) -> bool: ...

    def stored_output(self, completion: Completion) -> dict[str, str | None]:
        """What `/generation/content` keeps of the answer (`completion` and `reasoning` text, as returned)."""
        ...


class _TextDeltas:
    """One content delta per group of ids, however many characters it holds (possibly none)."""

    def __init__(self, decoder: Decoder) -> None:
        self.decoder = decoder

    def push(self, ids: list[int]) -> list[StreamDelta]:
        return [{"content": "".join([self.decoder.push(i) for i in ids])}]

    def flush(self) -> list[StreamDelta]:
        return [{"content": self.decoder.flush()}]


class TextReplies:
    """Answers as plain content, the text side's decoding of the ids (a plain model, synthetic words)."""

    def __init__(self, text: TokenText) -> None:
        self.text = text

    def message(self, completion: Completion) -> MessageFields:
        return {"content": self.text.decode(completion.completion_ids)}

    def deltas(self, completion: Completion, generation: GenerationRequest) -> DeltaStream:
        return _TextDeltas(self.text.decoder())

    def returns_token_ids(self, endpoint: Endpoint) -> bool:
        return True

    def stored_output(self, completion: Completion) -> dict[str, str | None]:
        return {"completion": self.text.decode(completion.completion_ids), "reasoning": None}
