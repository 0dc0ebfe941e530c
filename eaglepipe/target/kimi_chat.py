"""Kimi-K2.5's chat format, rendered natively to segments (no Jinja, no HF template).

Turns are `<|im_user|>{name or role}<|im_middle|>{content}<|im_end|>` (assistant: `<|im_assistant|>`,
system and tool results: `<|im_system|>`), with no newlines between them, no BOS and no default system
prompt; tool declarations come first. Like the stock template, assistant turns up to and including the
last one without tool calls are rendered with empty reasoning (`<think></think>`), so reasoning survives
only in the current tool-calling exchange. The generated turn is rendered separately, with its reasoning.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from eaglepipe.messages import Message, Tool, ToolCall
from eaglepipe.target.kimi_tools import ToolFormat, declare_tools
from eaglepipe.target.segments import RenderError, Segment, Special, Text, encode_segments, text_segment
from eaglepipe.target.tokenizer import TargetTokenizer

# In the field order of `Markers`.
MARKER_NAMES = (
    "<|im_user|>", "<|im_assistant|>", "<|im_system|>", "<|im_middle|>", "<|im_end|>", "<think>", "</think>",
    "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>", "<|tool_call_begin|>",
    "<|tool_call_argument_begin|>", "<|tool_call_end|>",
)


class KimiChatError(RenderError):
    """A conversation Kimi's chat format cannot render, in one line."""


@dataclass(frozen=True)
class Markers:
    """The special ids of Kimi's chat format, looked up by name once."""

    user: int
    assistant: int
    system: int
    middle: int
    end: int
    think: int
    think_end: int
    section_begin: int
    section_end: int
    call_begin: int
    argument_begin: int
    call_end: int

    @classmethod
    def of(cls, tokenizer: TargetTokenizer) -> Markers:
        return cls(*(tokenizer.special_id(name) for name in MARKER_NAMES))


def prompt_segments(
    tokenizer: TargetTokenizer,
    messages: list[Message],
    tools: list[Tool] | None = None,
    *,
    thinking: bool = True,
    tool_format: ToolFormat = "json",
) -> list[Segment]:
    """Everything the target reads before it answers, ending with the generation prompt:
    `<|im_assistant|>assistant<|im_middle|><think>` (thinking) or `...<think></think>` (instant)."""
    markers = Markers.of(tokenizer)
    segments: list[Segment] = []
    if tools:
        segments += turn(markers.system, "tool_declare", markers.middle)
        segments += [*text_segment(declare_tools(tools, tool_format), "tools"), Special(markers.end)]
    history_end = last_plain_assistant(messages)
    for index, message in enumerate(messages):
        keep_reasoning = thinking and index > history_end
        segments += message_segments(markers, message, index, keep_reasoning)
    segments += turn(markers.assistant, "assistant", markers.middle) + [Special(markers.think)]
    return segments if thinking else [*segments, Special(markers.think_end)]


def prompt_ids(
    tokenizer: TargetTokenizer,
    messages: list[Message],
    tools: list[Tool] | None = None,
    *,
    thinking: bool = True,
    tool_format: ToolFormat = "json",
) -> list[int]:
    segments = prompt_segments(tokenizer, messages, tools, thinking=thinking, tool_format=tool_format)
    return encode_segments(tokenizer, segments)


def completion_segments(
    tokenizer: TargetTokenizer,
    *,
    reasoning: str | None,
    content: str | None,
    tool_calls: list[ToolCall] | None,
    truncated: bool,
    thinking: bool = True,
) -> list[Segment]:
    """The generated turn after the prompt: `reasoning </think> content [tool section] <|im_end|>` (instant:
    no reasoning and no `</think>`). A truncated turn has no `<|im_end|>`, and no `</think>` when nothing
    followed the reasoning; one cut right after `</think>` looks the same, so a caller that must tell the two
    apart tries both."""
    markers = Markers.of(tokenizer)
    segments: list[Segment] = []
    if thinking:
        segments += text_segment(reasoning, "reasoning")
        if not truncated or content or tool_calls:
            segments.append(Special(markers.think_end))
    segments += text_segment(content, "content") + tool_section(markers, tool_calls or [], "generated turn")
    return segments if truncated else [*segments, Special(markers.end)]


def turn(marker: int, role_name: str, middle: int) -> list[Segment]:
    return [Special(marker), Text(role_name, "role"), Special(middle)]


def last_plain_assistant(messages: list[Message]) -> int:
    """Index of the last assistant message without tool calls (-1 if none): the end of the history whose
    reasoning the template drops."""
    plain = [i for i, m in enumerate(messages) if m.get("role") == "assistant" and not m.get("tool_calls")]
    return plain[-1] if plain else -1


def message_segments(markers: Markers, message: Message, index: int, keep_reasoning: bool) -> list[Segment]:
    role = message.get("role")
    if not isinstance(role, str):
        raise KimiChatError(f"messages[{index}] has no role; give every message a role string")
    role_name = message.get("name") or role
    marker = {"user": markers.user, "assistant": markers.assistant}.get(role, markers.system)
    segments = turn(marker, role_name, markers.middle)
    content = content_text(message, index)
    if role == "assistant":
        reasoning = (message.get("reasoning_content") or message.get("reasoning")) if keep_reasoning else None
        segments += [Special(markers.think), *text_segment(reasoning, "reasoning")]
        segments.append(Special(markers.think_end))
        segments += text_segment(content, "content")
        segments += tool_section(markers, message.get("tool_calls") or [], f"messages[{index}]")
    elif role == "tool":
        call_id = message.get("tool_call_id") or ""
        segments += text_segment(f"## Return of {call_id}\n{content}", "tool_result")
    else:
        segments += text_segment(content, "message")
    return [*segments, Special(markers.end)]


def content_text(message: Message, index: int) -> str:
    """A message's text: a string, or the text parts of a part list (images have no rendering here)."""
    content = message.get("content")
    if content is None or isinstance(content, str):
        return content or ""
    texts = [part.get("text") for part in content if isinstance(part, dict) and part.get("type") == "text"]
    strings = [text for text in texts if isinstance(text, str)]
    if len(strings) != len(content):
        raise KimiChatError(
            f"messages[{index}] has a non-text content part; only text parts can be rendered: drop the others"
        )
    return "".join(strings)


def tool_section(markers: Markers, tool_calls: list[ToolCall], where: str) -> list[Segment]:
    """`<|tool_calls_section_begin|>` + per call `<|tool_call_begin|>{id}<|tool_call_argument_begin|>{args}
    <|tool_call_end|>` + `<|tool_calls_section_end|>`; nothing when there are no calls."""
    if not tool_calls:
        return []
    segments: list[Segment] = [Special(markers.section_begin)]
    for number, call in enumerate(tool_calls):
        arguments = call_arguments(call, f"{where} call {number}")
        segments += [Special(markers.call_begin), *text_segment(call.get("id"), "tool_call_id")]
        segments += [Special(markers.argument_begin), *text_segment(arguments, "tool_arguments")]
        segments.append(Special(markers.call_end))
    return [*segments, Special(markers.section_end)]


def call_arguments(call: ToolCall, where: str) -> str:
    """String arguments verbatim (as the model wrote them); others as the template's `tojson`."""
    function = call.get("function")
    if not isinstance(function, dict):
        raise KimiChatError(f"{where}: a tool call needs a 'function' object with 'name' and 'arguments'")
    arguments = function.get("arguments")
    return arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)


def tool_history(messages: list[Message]) -> int:
    """Tool calls already made in the conversation: Kimi numbers the next call's id from here."""
    return sum(len(m.get("tool_calls") or []) for m in messages if m.get("role") == "assistant")
