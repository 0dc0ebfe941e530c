"""Model mode for a target in Kimi-K2.5's layout (the tiny Kimi-K2.5): the model's own answers, returned as
each endpoint's provider would return them.

The prompt is Kimi's template with tools declared in TypeScript, as a thinking turn unless the request
turns reasoning off. The model's ids are split into reasoning, content and tool calls by the serving
endpoint's habits (`habits.provider_reply`, as the tests' Kimi corpus mode does). A stream cannot know
the answer ahead, so at each event it re-reads the ids so far as the provider's parser would and sends
what grew, holding back what the rest of the answer can still change: trailing whitespace (a stripping parser
drops it at `</think>`), a tool call until it is closed, and content that a `drops_text` parser may lose.
"""

from __future__ import annotations

from eaglepipe.chat_api import MessageFields, StreamDelta
from eaglepipe.emulator.backend import GenerationFailed, GenerationRequest
from eaglepipe.emulator.completion import Completion
from eaglepipe.emulator.habits import (
    call_deltas,
    provider_reply,
    reasoning_delta,
    reasoning_tokens,
    reply_message,
)
from eaglepipe.emulator.providers import Endpoint
from eaglepipe.emulator.text_like import SWITCHES, EngineReply
from eaglepipe.messages import Message, Tool
from eaglepipe.target.chat_format import ChatFormat, chat_format_for
from eaglepipe.target.tokenizer import TargetTokenizer


class KimiModelText:
    """The app's text side for a Kimi-layout model: Kimi's template, and token bytes for logprobs."""

    def __init__(self, tokenizer: TargetTokenizer) -> None:
        self.tokenizer = tokenizer
        self.format: ChatFormat = chat_format_for(tokenizer)

    def prompt_ids(
        self, messages: list[Message], tools: list[Tool] | None, *, thinking: bool
    ) -> list[int]:
        return self.format.prompt_ids(messages, tools, thinking=thinking, tool_format="typescript")

    def token_bytes(self, token_id: int) -> bytes:
        return self.tokenizer.token_bytes(token_id)


class KimiModelReplies:
    """The reply shape (backend.ReplyShape) of a Kimi-layout model: each endpoint's habits on its ids."""

    def __init__(self, text: KimiModelText) -> None:
        self.tokenizer = text.tokenizer
        think_end = text.format.layout.think_end
        assert think_end is not None  # a Kimi layout has one
        self.think_end = think_end

    def reply(self, completion: Completion, ids: list[int], stopped: bool) -> EngineReply:
        return provider_reply(
            self.tokenizer,
            ids,
            stopped,
            completion.endpoint.habits,
            thinking=completion.thinking,
            tool_history=completion.tool_history,
        )

    def settle(self, completion: Completion, reply: EngineReply) -> None:
        completion.calls_tools = bool(reply.tool_calls)
        completion.reasoning_tokens = reasoning_tokens(
            completion.completion_ids, self.think_end, completion.thinking
        )

    def message(self, completion: Completion) -> MessageFields:
        reply = self.reply(completion, completion.completion_ids, completion.stopped)
        self.settle(completion, reply)
        return reply_message(reply, completion.endpoint.habits)

    def deltas(self, completion: Completion, generation: GenerationRequest) -> GrowingReply:
        return GrowingReply(self, completion)

    def returns_token_ids(self, endpoint: Endpoint) -> bool:
        return SWITCHES[endpoint.habits.text_like].returns_token_ids

    def stored_output(self, completion: Completion) -> dict[str, str | None]:
        reply = self.reply(completion, completion.completion_ids, completion.stopped)
        return {"completion": reply.content, "reasoning": reply.reasoning}


class GrowingReply:
    """A streamed answer's deltas, from the ids so far (see the module's docstring)."""

    def __init__(self, replies: KimiModelReplies, completion: Completion) -> None:
        self.replies = replies
        self.completion = completion
        self.habits = completion.endpoint.habits
        self.ids: list[int] = []
        self.reasoning = ""
        self.content = ""
        self.calls = 0

    def push(self, ids: list[int]) -> list[StreamDelta]:
        self.ids += ids
        return self._grown(self.replies.reply(self.completion, self.ids, stopped=False), final=False)

    def flush(self) -> list[StreamDelta]:
        completion = self.completion
        reply = self.replies.reply(completion, completion.completion_ids, completion.stopped)
        self.replies.settle(completion, reply)
        return self._grown(reply, final=True)

    def _grown(self, reply: EngineReply, final: bool) -> list[StreamDelta]:
        deltas: list[StreamDelta] = []
        reasoning = reply.reasoning or ""
        content = reply.content
        if not final:
            reasoning = reasoning.rstrip()
            content = "" if self.habits.tool_parser == "drops_text" else content.rstrip()
        for field, now in (("reasoning", reasoning), ("content", content)):
            before = getattr(self, field)
            if not now.startswith(before):
                raise GenerationFailed(
                    f"the {field} sent so far ({before[-40:]!r}) is not a prefix of the answer's "
                    f"{field} ({now[:80]!r}): the emulator's stream parser is wrong"
                )
            if len(now) > len(before):
                piece = now[len(before) :]
                deltas.append(
                    reasoning_delta(piece, self.habits) if field == "reasoning" else {"content": piece}
                )
                setattr(self, field, now)
        for position in range(self.calls, len(reply.tool_calls)):
            deltas += call_deltas(position, reply.tool_calls[position], self.habits)
        self.calls = len(reply.tool_calls)
        return deltas
