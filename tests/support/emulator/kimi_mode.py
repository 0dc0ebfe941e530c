"""Kimi mode (`--synthetic --kimi-corpus DIR`): the offline Kimi corpus over HTTP, as providers return it.

The emulator builds the seeded corpus (kimi_synthetic.kimi_corpus) with the Kimi-layout tokenizer in DIR
and answers a conversation (messages and tools) of one of its samples with that sample's true ids, at
synthetic mode's pace. Conversations are matched as the model reads them, by their rendered prompt (Kimi's
template, tools declared in TypeScript): a key the template ignores, such as the reasoning of a finished
turn (which the prompt stage drops), changes nothing. A conversation outside the corpus gets a 400, so a
test that asks the wrong prompt fails at once.

Each endpoint's `habits` decide what the client sees (eaglepipe/emulator/habits.py). Usage bills the true
ids (its `reasoning_tokens`: those before `</think>`), so the token stage's rebuild can be checked against
ground truth after a real HTTP run.

The prompt's ids (and so its bill) are the sample's own rendering (thinking as the sample was generated),
whatever the endpoint and whatever the request's `reasoning` says.
"""

from __future__ import annotations

import math
from pathlib import Path

from eaglepipe.chat_api import MessageFields, StreamDelta
from eaglepipe.emulator.backend import GeneratedToken, GenerationRequest
from eaglepipe.emulator.completion import Completion
from eaglepipe.emulator.errors import ApiError, EmulatorError
from eaglepipe.emulator.habits import provider_reply, reasoning_tokens, reply_message, stream_deltas
from eaglepipe.emulator.providers import Endpoint, ReplyHabits
from eaglepipe.emulator.text_like import SWITCHES, EngineReply
from eaglepipe.messages import Message, Tool
from eaglepipe.target import kimi_chat
from eaglepipe.target.chat_format import ChatFormat, chat_format_for
from eaglepipe.target.load import load_target_tokenizer
from eaglepipe.target.tokenizer import TargetTokenizer
from support.emulator.kimi_synthetic import TrueSample, kimi_corpus
from support.emulator.synthetic import Pace, SyntheticStream


def rendered_prompt(
    chat_format: ChatFormat,
    messages: list[Message],
    tools: list[Tool] | None,
    thinking: bool,
) -> tuple[int, ...]:
    """The prompt's ids as the corpus renders them (tools declared in TypeScript)."""
    return tuple(chat_format.prompt_ids(messages, tools, thinking=thinking, tool_format="typescript"))


def served_ids(sample: TrueSample, max_tokens: int) -> tuple[list[int], bool]:
    """The answer's ids within `max_tokens`, and whether the stop token follows them."""
    answer = sample.answer_ids
    return answer[:max_tokens], sample.stopped and len(answer) < max_tokens


class KimiCorpus:
    """The corpus, indexed by its samples' rendered prompts."""

    def __init__(self, tokenizer: TargetTokenizer, samples: list[TrueSample], seed: int) -> None:
        self.tokenizer = tokenizer
        self.format = chat_format_for(tokenizer)
        self.seed = seed
        self.samples = samples
        self.by_prompt: dict[tuple[int, ...], TrueSample] = {}
        for sample in samples:
            prompt = rendered_prompt(
                self.format, sample.prompt["messages"], sample.prompt.get("tools"), sample.thinking
            )
            self.by_prompt.setdefault(prompt, sample)  # a repeated conversation keeps its first answer

    @classmethod
    def build(cls, directory: Path, count: int, seed: int) -> KimiCorpus:
        try:
            tokenizer = load_target_tokenizer(directory)
            kimi_chat.Markers.of(tokenizer)
        except (OSError, ValueError) as exc:
            raise EmulatorError(
                f"{directory}: not a Kimi-layout tokenizer directory ({exc}); pass --kimi-corpus the "
                "directory eaglepipe.target.kimi_layout.ensure_kimi_layout builds"
            ) from None
        return cls(tokenizer, kimi_corpus(tokenizer, count, seed), seed)

    def sample_for(self, prompt_ids: list[int]) -> TrueSample:
        return self.by_prompt[tuple(prompt_ids)]


class KimiText:
    """The app's text side: a corpus conversation's prompt ids, and token bytes for logprobs."""

    def __init__(self, corpus: KimiCorpus) -> None:
        self.corpus = corpus

    def prompt_ids(
        self, messages: list[Message], tools: list[Tool] | None, *, thinking: bool
    ) -> list[int]:
        """The sample's prompt, rendered as a thinking turn or else as an instant one."""
        for thinking in (True, False):
            ids = rendered_prompt(self.corpus.format, messages, tools, thinking)
            if ids in self.corpus.by_prompt:
                return list(ids)
        raise ApiError(
            400,
            f"this conversation is not in the emulator's Kimi corpus ({len(self.corpus.samples)} "
            f"samples, seed {self.corpus.seed}); send the messages and tools of one of its samples",
            "invalid_request",
        )

    def token_bytes(self, token_id: int) -> bytes:
        return self.corpus.tokenizer.token_bytes(token_id)


class KimiEngine:
    """Streams the sample's true ids at synthetic mode's pace; like most providers it cannot cancel."""

    cancellable = False

    def __init__(self, corpus: KimiCorpus, pace: Pace) -> None:
        self.corpus = corpus
        self.stop_id = corpus.format.layout.stop
        self.pace = pace
        self.batches = 0
        self.sequences = 0
        self.largest_batch = 0

    def start(self) -> None:
        """Nothing runs beside the event loop."""

    def close(self) -> None:
        """Nothing to stop."""

    def stream(self, request: GenerationRequest) -> SyntheticStream:
        ids, stopped = served_ids(self.corpus.sample_for(request.prompt_ids), request.max_tokens)
        logprob = 0.0 if request.top_logprobs is not None else None  # the corpus knows no probabilities
        tokens = [GeneratedToken(i, logprob) for i in ids]
        if stopped:
            tokens.append(GeneratedToken(self.stop_id))
        self.batches += 1
        self.sequences += 1
        self.largest_batch = 1
        return SyntheticStream(tokens, self.pace, request.event_tokens)


def _sample_reply(
    tokenizer: TargetTokenizer, sample: TrueSample, ids: list[int], stopped: bool, habits: ReplyHabits
) -> EngineReply:
    return provider_reply(
        tokenizer, ids, stopped, habits, thinking=sample.thinking, tool_history=sample.tool_history
    )


class _PlannedDeltas:
    """A planned answer's deltas, released in step with its ids: after k of n ids, k/n of the deltas."""

    def __init__(self, deltas: list[StreamDelta], planned_ids: int) -> None:
        self.deltas = deltas
        self.planned_ids = planned_ids
        self.seen = 0
        self.sent = 0

    def push(self, ids: list[int]) -> list[StreamDelta]:
        self.seen += len(ids)
        due = min(len(self.deltas), math.ceil(self.seen * len(self.deltas) / max(1, self.planned_ids)))
        released, self.sent = self.deltas[self.sent : due], max(self.sent, due)
        return released

    def flush(self) -> list[StreamDelta]:
        released, self.sent = self.deltas[self.sent :], len(self.deltas)
        return released


class KimiReplies:
    """The reply shape of Kimi mode (backend.ReplyShape): each endpoint's habits applied to the true ids."""

    def __init__(self, corpus: KimiCorpus) -> None:
        self.corpus = corpus
        self.think_end = corpus.format.layout.sections().think_end

    def message(self, completion: Completion) -> MessageFields:
        habits = completion.endpoint.habits
        sample = self.corpus.sample_for(completion.prompt_ids)
        reply = _sample_reply(
            self.corpus.tokenizer, sample, completion.completion_ids, completion.stopped, habits
        )
        completion.calls_tools = bool(reply.tool_calls)
        completion.reasoning_tokens = reasoning_tokens(
            completion.completion_ids, self.think_end, sample.thinking
        )
        return reply_message(reply, habits)

    def deltas(self, completion: Completion, generation: GenerationRequest) -> _PlannedDeltas:
        habits = completion.endpoint.habits
        sample = self.corpus.sample_for(completion.prompt_ids)
        ids, stopped = served_ids(sample, generation.max_tokens)
        reply = _sample_reply(self.corpus.tokenizer, sample, ids, stopped, habits)
        completion.calls_tools = bool(reply.tool_calls)
        completion.reasoning_tokens = reasoning_tokens(ids, self.think_end, sample.thinking)
        return _PlannedDeltas(stream_deltas(reply, habits), len(ids))

    def returns_token_ids(self, endpoint: Endpoint) -> bool:
        return SWITCHES[endpoint.habits.text_like].returns_token_ids

    def stored_output(self, completion: Completion) -> dict[str, str | None]:
        habits = completion.endpoint.habits
        sample = self.corpus.sample_for(completion.prompt_ids)
        reply = _sample_reply(
            self.corpus.tokenizer, sample, completion.completion_ids, completion.stopped, habits
        )
        return {"completion": reply.content, "reasoning": reply.reasoning}
