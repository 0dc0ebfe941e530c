"""How a provider with given habits (providers.ReplyHabits) returns a Kimi-layout answer's ids: the engine
switch's reasoning, content and tool calls, where the reasoning goes, the tool-call ids and streamed
indexes, and a tool parser that loses or leaks text. The Kimi-layout model (kimi_model.py) answers through
it, and so does the tests' Kimi corpus mode.
"""

from __future__ import annotations

import secrets
from dataclasses import replace

from eaglepipe.chat_api import MessageFields, ReasoningDetail, StreamDelta, ToolCallDelta
from eaglepipe.emulator.providers import ReplyHabits
from eaglepipe.emulator.text_like import SECTION_BEGIN, SWITCHES, EngineReply, detokenize, engine_reply
from eaglepipe.messages import ToolCall
from eaglepipe.target.tokenizer import TargetTokenizer

PIECE_CHARS = 16  # characters of reasoning, content or arguments per streamed delta


def provider_reply(
    tokenizer: TargetTokenizer,
    ids: list[int],
    stopped: bool,
    habits: ReplyHabits,
    *,
    thinking: bool,
    tool_history: int,
) -> EngineReply:
    """What a provider with these habits returns for answer ids `ids` (`tool_history`: the calls the
    conversation made before, from which Kimi numbers the next call's id)."""
    switch = SWITCHES[habits.text_like]
    reply = engine_reply(
        tokenizer, ids, switch, stopped=stopped, thinking=thinking, tool_history=tool_history
    )
    content = reply.content
    if habits.tool_parser == "drops_text" and reply.tool_calls:
        content = ""
    elif habits.tool_parser == "leaks_markers":
        text = detokenize(tokenizer, ids, switch)
        if (cut := text.find(SECTION_BEGIN)) >= 0:
            content += text[cut:]
    calls: list[ToolCall] = [
        {**call, "id": _call_id(habits, call, n)} for n, call in enumerate(reply.tool_calls)
    ]
    return replace(reply, content=content, tool_calls=calls)


def _call_id(habits: ReplyHabits, call: ToolCall, position: int) -> str:
    if habits.tool_ids == "call_random":
        return "call_" + secrets.token_hex(12)
    if habits.tool_ids == "renumbered":
        return f"functions.{call['function']['name']}:{position}"
    return call["id"]


def _reasoning_detail(text: str) -> ReasoningDetail:
    return {"type": "reasoning.text", "text": text, "format": "unknown", "index": 0}


def _pieces(text: str) -> list[str]:
    return [text[i : i + PIECE_CHARS] for i in range(0, len(text), PIECE_CHARS)]


def reasoning_delta(piece: str, habits: ReplyHabits) -> StreamDelta:
    delta: StreamDelta = {"content": "", "reasoning_details": [_reasoning_detail(piece)]}
    if habits.reasoning_field == "reasoning":
        delta["reasoning"] = piece
    return delta


def call_deltas(position: int, call: ToolCall, habits: ReplyHabits) -> list[StreamDelta]:
    """One call's deltas: its id, type and name, then its arguments in pieces."""
    index = 0 if habits.tool_index == "zero" else position
    function = call["function"]
    opening: ToolCallDelta = {
        "index": index,
        "id": call["id"],
        "type": "function",
        "function": {"name": function["name"], "arguments": ""},
    }
    deltas: list[StreamDelta] = [{"tool_calls": [opening]}]
    return deltas + [
        {"tool_calls": [{"index": index, "function": {"arguments": piece}}]}
        for piece in _pieces(function["arguments"])
    ]


def stream_deltas(reply: EngineReply, habits: ReplyHabits) -> list[StreamDelta]:
    """The reply as stream deltas: reasoning, then content, then each call (id and name, then its
    arguments in pieces)."""
    deltas = [reasoning_delta(piece, habits) for piece in _pieces(reply.reasoning or "")]
    deltas += [{"content": piece} for piece in _pieces(reply.content)]
    for position, call in enumerate(reply.tool_calls):
        deltas += call_deltas(position, call, habits)
    return deltas


def reply_message(reply: EngineReply, habits: ReplyHabits) -> MessageFields:
    """The assistant message of a plain (not streamed) answer."""
    message: MessageFields = {
        "content": reply.content,
        "reasoning": reply.reasoning if habits.reasoning_field == "reasoning" else None,
    }
    if reply.reasoning:
        message["reasoning_details"] = [_reasoning_detail(reply.reasoning)]
    if reply.tool_calls:
        message["tool_calls"] = reply.tool_calls
    return message


def reasoning_tokens(ids: list[int], think_end: int, thinking: bool) -> int:
    """The ids before `</think>` (all of them when the answer was cut inside its reasoning)."""
    if not thinking:
        return 0
    return ids.index(think_end) if think_end in ids else len(ids)
