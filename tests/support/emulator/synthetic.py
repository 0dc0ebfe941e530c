"""Synthetic mode (`--synthetic`): OpenRouter at a provider's pace and billing, with no model at all.

It rehearses a large run on a small machine: thousands of requests in flight on one core, answers of
heavy-tailed length, a paced decode, and the same routing, billing and errors as model mode, without
importing torch or a tokenizer. Each token is one word of a fixed made-up vocabulary, so decoding is
concatenation. The clock wakes once per streamed event (or once per answer when not streamed), never
once per token.
"""

from __future__ import annotations

import asyncio
import hashlib
import math
import random
import time
from array import array
from dataclasses import dataclass

from eaglepipe.emulator.backend import GeneratedToken, GenerationRequest
from eaglepipe.messages import Message, Tool
from eaglepipe.target.chat import normalize_messages

STOP_ID = 0
VOCABULARY_SIZE = 4096  # the stop token and 4095 words
_WORDS = VOCABULARY_SIZE - 1
_CONSONANTS = "bdfghklmnprstvz"
_VOWELS = "aeiou"


def _words(count: int) -> list[str]:
    """`count` distinct pronounceable words, each with its leading space, the same in every run."""
    rng = random.Random(7)
    words: dict[str, None] = {}
    while len(words) < count:
        syllables = rng.choice((1, 2, 2, 2, 3, 3))
        words[" " + "".join(rng.choice(_CONSONANTS) + rng.choice(_VOWELS) for _ in range(syllables))] = None
    return list(words)


def render_prompt(messages: list[Message], tools: list[Tool] | None) -> bytes:
    """The conversation as ChatML, tools as a system turn: what `prompt_tokens` is estimated from."""
    turns = normalize_messages(None, messages, tools)  # None: no chat template, so no tool support
    text = "".join(f"<|im_start|>{t['role']}\n{t['content']}<|im_end|>\n" for t in turns)
    return f"{text}<|im_start|>assistant\n".encode()


class _WordDecoder:
    def __init__(self, words: list[str]) -> None:
        self.words = words

    def push(self, token_id: int) -> str:
        return self.words[token_id]

    def flush(self) -> str:
        return ""


class WordText:
    """The synthetic vocabulary as the app's text side (`backend.TokenText`).

    Prompt ids are the rendered prompt's UTF-8 bytes read four at a time (each folded into the
    vocabulary), so `prompt_tokens` is ceil(bytes / 4), a usual estimate for English text.
    """

    def __init__(self) -> None:
        self.words = ["<|im_end|>", *_words(_WORDS)]

    def prompt_ids(
        self, messages: list[Message], tools: list[Tool] | None, *, thinking: bool
    ) -> list[int]:
        data = render_prompt(messages, tools)
        data += b"\0" * (-len(data) % 4)
        return [word % _WORDS + 1 for word in memoryview(data).cast("I")]

    def decode(self, ids: list[int]) -> str:
        return "".join([self.words[i] for i in ids])

    def decoder(self) -> _WordDecoder:
        return _WordDecoder(self.words)

    def token_bytes(self, token_id: int) -> bytes:
        return self.words[token_id].encode()


@dataclass(frozen=True)
class Pace:
    """A provider's speed: time to the first token, then a steady decode (0 tokens/s: instant)."""

    latency_s: float = 0.2
    tokens_per_s: float = 50.0

    def due_s(self, index: int) -> float:
        """Seconds after the request started when token `index` (0-based) is ready."""
        return self.latency_s + (index / self.tokens_per_s if self.tokens_per_s > 0 else 0.0)


class SyntheticStream:
    """One answer's tokens, each group of `group` released together once its last token is due.

    A plain iterator object rather than an async generator: a wait cut short by a cancellation
    leaves it intact, so the rest of the answer can still be run out and billed.
    """

    def __init__(self, tokens: list[GeneratedToken], pace: Pace, group: int) -> None:
        self.tokens = tokens
        self.pace = pace
        self.group = max(1, group)
        self.start = time.monotonic()
        self.position = 0
        self.released = 0

    def __aiter__(self) -> SyntheticStream:
        return self

    async def __anext__(self) -> GeneratedToken:
        if self.position == len(self.tokens):
            raise StopAsyncIteration
        if self.position == self.released:
            end = min(self.position + self.group, len(self.tokens))
            wait_s = self.start + self.pace.due_s(end - 1) - time.monotonic()
            if wait_s > 0:
                await asyncio.sleep(wait_s)
            self.released = end
        token = self.tokens[self.position]
        self.position += 1
        return token


class SyntheticEngine:
    """Answers of lognormal length (mean `mean_tokens`, shape `length_sigma`) of random words.

    The answer depends on the prompt and `--seed`, plus the request's seed when given; a greedy
    request (temperature 0) without one always gets the same answer; otherwise a per-request counter
    makes each answer new. It cannot cancel (`cancellable` False), like many real providers.
    """

    stop_id = STOP_ID
    cancellable = False

    def __init__(
        self,
        *,
        pace: Pace,
        mean_tokens: float = 300.0,
        length_sigma: float = 1.0,
        seed: int | None = None,
    ) -> None:
        self.mu = math.log(mean_tokens) - length_sigma**2 / 2  # so that the mean is mean_tokens
        self.sigma = length_sigma
        self.pace = pace
        self.seed = random.getrandbits(63) if seed is None else seed
        self.batches = 0  # every answer is its own batch of one
        self.sequences = 0
        self.largest_batch = 0
        self._unseeded = 0
        self._word_tokens = [GeneratedToken(i) for i in range(1, VOCABULARY_SIZE)]
        self._uniform_logprob = -math.log(_WORDS)

    def start(self) -> None:
        """Nothing runs beside the event loop."""

    def close(self) -> None:
        """Nothing to stop."""

    def stream(self, request: GenerationRequest) -> SyntheticStream:
        rng = random.Random(self._answer_seed(request))
        words = max(1, round(rng.lognormvariate(self.mu, self.sigma)))
        tokens = rng.choices(self._word_tokens, k=min(words, request.max_tokens))
        if request.top_logprobs is not None:
            tokens = [self._with_logprobs(t.token_id, request.top_logprobs) for t in tokens]
        if words < request.max_tokens:
            tokens.append(GeneratedToken(STOP_ID))
        self.batches += 1
        self.sequences += 1
        self.largest_batch = 1
        return SyntheticStream(tokens, self.pace, request.event_tokens)

    def _answer_seed(self, request: GenerationRequest) -> int:
        if request.seed is not None:
            salt = f"seed {request.seed}"
        elif request.temperature == 0:
            salt = "greedy"
        else:
            self._unseeded += 1
            salt = f"request {self._unseeded}"
        digest = hashlib.blake2b(f"{self.seed} {salt}\n".encode(), digest_size=8)
        digest.update(array("I", request.prompt_ids))
        return int.from_bytes(digest.digest(), "big")

    def _with_logprobs(self, token_id: int, top_logprobs: int) -> GeneratedToken:
        """Every word equally likely: the token itself and the next ids as alternatives."""
        top = tuple(((token_id - 1 + k) % _WORDS + 1, self._uniform_logprob) for k in range(top_logprobs))
        return GeneratedToken(token_id, self._uniform_logprob, top)
