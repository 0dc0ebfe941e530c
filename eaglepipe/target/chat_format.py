"""One chat-format interface for every stage: how a target renders prompts and holds its completions.

Two families sit behind it. Kimi-K2.5 renders natively (`kimi_chat`): `reasoning </think> content [tool
section] <|im_end|>`, tool declarations in one of two formats. An HF chat template (the embedded SmolLM2's
ChatML) renders through `chat.render_prompt_ids`, and its answer is one text then the stop id. The token
stage, the emulator, the spend plan and the evaluation all go through `ChatFormat`, loaded once per stage
for the target's tokenizer (`chat_format_for(load_target_tokenizer(dir))`), so none of them branches on
the family.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import cached_property
from typing import Protocol

import numpy as np

from eaglepipe.messages import Message, Tool, ToolCall
from eaglepipe.target import chatml, kimi_chat
from eaglepipe.target.chat import render_prompt_ids
from eaglepipe.target.hf_tokenizer import HFTokenizer
from eaglepipe.target.kimi_tokenizer import MAX_RUN_CHARS, KimiTokenizer
from eaglepipe.target.kimi_tools import ToolDeclarationError, ToolFormat, declare_tools
from eaglepipe.target.segments import Segment, Text, encode_segments
from eaglepipe.target.tokenizer import TargetTokenizer


@dataclass(frozen=True)
class Layout:
    """The special ids a completion may hold; the Kimi markers are None for ChatML targets."""

    stop: int
    think_end: int | None = None
    section_begin: int | None = None
    section_end: int | None = None
    call_begin: int | None = None
    argument_begin: int | None = None
    call_end: int | None = None

    def sections(self) -> SectionMarkers:
        """The markers of a sectioned (Kimi) format, every one set; ValueError for a one-text layout."""
        markers = (
            self.think_end,
            self.section_begin,
            self.section_end,
            self.call_begin,
            self.argument_begin,
            self.call_end,
        )
        if None in markers:
            raise ValueError("this chat format keeps no sections: its layout has no Kimi markers")
        return SectionMarkers(self.stop, *(marker for marker in markers if marker is not None))


@dataclass(frozen=True)
class SectionMarkers:
    """A sectioned completion's special ids (`Layout.sections`)."""

    stop: int
    think_end: int
    section_begin: int
    section_end: int
    call_begin: int
    argument_begin: int
    call_end: int


@dataclass
class ReadBack:
    """Completion ids (without the stop id) read back into the parts an engine returns."""

    reasoning: str = ""
    think_end: bool = False
    content: str = ""
    section: bool = False
    calls: list[tuple[str, str]] = field(default_factory=list)  # (the model's id, its arguments)


class ChatFormat(Protocol):
    """What the stages need from a target's chat format."""

    special_ids: frozenset[int]
    # Tool-declaration formats it can render (the token stage tries the configured one, then these);
    # empty for a template, which declares tools its own way.
    tool_formats: tuple[ToolFormat, ...]
    # True when a completion keeps reasoning, content and tool calls apart with special ids (Kimi); False
    # when it is one text then the stop id (ChatML).
    sectioned: bool

    def __hash__(self) -> int:  # the token stage caches tables per format
        ...

    @property
    def tokenizer(self) -> TargetTokenizer:
        """The tokenizer it was loaded with (each family's own: read-only here, so each may say which)."""
        ...

    @property
    def layout(self) -> Layout: ...

    def encode(self, text: str) -> list[int]:
        """Ids of ordinary text, exactly as the format's prompts and completions encode it."""
        ...

    def prompt_ids(
        self,
        messages: list[Message],
        tools: list[Tool] | None,
        *,
        thinking: bool,
        tool_format: ToolFormat,
    ) -> list[int]:
        """Everything the target reads before it answers, ending with the generation prompt; raises
        `segments.RenderError` for a conversation or tool schema the format cannot render."""
        ...

    def generation_prompt(self, thinking: bool) -> list[int]:
        """The ids every rendered prompt ends with: what the target reads right before it answers."""
        ...

    def special_positions(self, ids: list[int]) -> list[int]:
        """Where the special ids are, found without a Python loop over the ids."""
        ...

    def tool_format_name(self, tool_format: ToolFormat) -> str:
        """What a prompt rendered with `tool_format` declared its tools with: the format, or the template
        (the key of `tokens.json` `prompt.tool_formats`)."""
        ...

    def other_tool_format_lengths(
        self, tools: list[Tool], used: ToolFormat, length: int
    ) -> dict[ToolFormat, int]:
        """A prompt's length under each other tool format it can render, from its `length` under `used`."""
        ...

    def one_text_answer(self, content: str, tool_calls: list[ToolCall] | None) -> str | None:
        """The answer as the one text the format renders (tool calls inside it), or None when the format
        keeps content and tool calls in their own sections."""
        ...

    def completion_segments(
        self,
        *,
        reasoning: str | None,
        content: str | None,
        tool_calls: list[ToolCall] | None,
        truncated: bool,
        thinking: bool,
    ) -> list[Segment]:
        """The generated turn after the prompt, as text pieces and special ids."""
        ...

    def read_completion(self, ids: list[int], *, thinking: bool, truncated: bool) -> ReadBack | None:
        """Completion ids (without the stop id) read back as an engine splits them; None when a special id
        stands where this format cannot have put it."""
        ...


class KimiChatFormat:
    """Kimi-K2.5's native chat format (`kimi_chat`, `kimi_tools`)."""

    tool_formats: tuple[ToolFormat, ...] = ("typescript", "json")
    sectioned = True

    def __init__(self, tokenizer: KimiTokenizer) -> None:
        self.tokenizer = tokenizer
        self.markers = kimi_chat.Markers.of(tokenizer)
        markers = self.markers
        self.layout = Layout(
            markers.end,
            markers.think_end,
            markers.section_begin,
            markers.section_end,
            markers.call_begin,
            markers.argument_begin,
            markers.call_end,
        )
        self.num_ranks = tokenizer.num_ranks
        self.special_ids = frozenset(range(self.num_ranks, tokenizer.vocab_size))
        self._ordinary = tokenizer.encoding.encode_ordinary
        self._declarations: dict[tuple[str, str], int] = {}

    def encode(self, text: str) -> list[int]:
        """Kimi's encoder, skipping its run and window cuts for texts too short to be cut (the same ids):
        the scan for long runs costs as much as a fifth of encoding, for nothing, on chat-sized pieces."""
        return self._ordinary(text) if len(text) <= MAX_RUN_CHARS else self.tokenizer.encode(text)

    def prompt_ids(
        self,
        messages: list[Message],
        tools: list[Tool] | None,
        *,
        thinking: bool,
        tool_format: ToolFormat,
    ) -> list[int]:
        segments = kimi_chat.prompt_segments(
            self.tokenizer, messages, tools, thinking=thinking, tool_format=tool_format
        )
        return encode_segments(self, segments)

    @cached_property
    def _openings(self) -> dict[bool, list[int]]:
        markers = self.markers
        opening = [markers.assistant, *self.tokenizer.encode("assistant"), markers.middle, markers.think]
        return {True: opening, False: [*opening, markers.think_end]}

    def generation_prompt(self, thinking: bool) -> list[int]:
        return self._openings[thinking]

    def special_positions(self, ids: list[int]) -> list[int]:
        return np.flatnonzero(np.asarray(ids, dtype=np.int64) >= self.num_ranks).tolist()

    def tool_format_name(self, tool_format: ToolFormat) -> str:
        return tool_format

    def other_tool_format_lengths(
        self, tools: list[Tool], used: ToolFormat, length: int
    ) -> dict[ToolFormat, int]:
        """The text between `<|im_middle|>` and `<|im_end|>` is encoded on its own, so formats differ by
        exactly their declarations' lengths. A format that cannot render the tools is left out."""
        lengths: dict[ToolFormat, int] = {}
        for other in self.tool_formats:
            if other == used:
                continue
            try:
                declared = self._declaration_length(tools, other)
            except ToolDeclarationError:
                continue
            lengths[other] = length - self._declaration_length(tools, used) + declared
        return lengths

    def _declaration_length(self, tools: list[Tool], tool_format: ToolFormat) -> int:
        """Tokens of a tool declaration; prompts with the same tools share it."""
        key = (json.dumps(tools, sort_keys=True), tool_format)
        if key not in self._declarations:
            self._declarations[key] = len(self.encode(declare_tools(tools, tool_format)))
        return self._declarations[key]

    def one_text_answer(self, content: str, tool_calls: list[ToolCall] | None) -> str | None:
        return None

    def completion_segments(
        self,
        *,
        reasoning: str | None,
        content: str | None,
        tool_calls: list[ToolCall] | None,
        truncated: bool,
        thinking: bool,
    ) -> list[Segment]:
        return kimi_chat.completion_segments(
            self.tokenizer,
            reasoning=reasoning,
            content=content,
            tool_calls=tool_calls,
            truncated=truncated,
            thinking=thinking,
        )

    def read_completion(self, ids: list[int], *, thinking: bool, truncated: bool) -> ReadBack | None:
        """Walk the ids as `reasoning </think> content [section] ...`. A call cut off by the length limit
        is left out (engines return it, or not)."""
        layout, decode = self.layout, self.tokenizer.decode
        read = ReadBack(think_end=not thinking)
        state, call_id = ("reasoning" if thinking else "content"), ""
        transitions = {
            ("reasoning", layout.think_end): "content",
            ("reasoning", layout.section_begin): "section",
            ("content", layout.section_begin): "section",
            ("section", layout.call_begin): "id",
            ("id", layout.argument_begin): "arguments",
            ("arguments", layout.call_end): "section",
            ("section", layout.section_end): "closed",
        }
        start = 0
        for position in [*self.special_positions(ids), None]:
            token_id = ids[position] if position is not None else None
            text = decode(ids[start:position])
            start = position + 1 if position is not None else start
            if state == "reasoning":
                read.reasoning += text
            elif state == "content":
                read.content += text
            elif state == "id":
                call_id += text
            elif state == "arguments" and token_id == layout.call_end:
                read.calls.append((call_id, text))
                call_id = ""
            elif text and state == "closed":
                return None
            if token_id is None:
                break
            next_state = transitions.get((state, token_id))
            if next_state is None:
                return None
            state = next_state
            read.think_end |= token_id == layout.think_end
            read.section |= token_id == layout.section_begin
        if state in ("id", "arguments") and not truncated:
            return None
        return read


class TemplateChatFormat:
    """An HF chat template (SmolLM2's ChatML): prompts through `chat.render_prompt_ids`, the answer as one
    text (tool calls rendered into it) then the stop id. The template cannot reason; `thinking` and
    `tool_format` change nothing."""

    tool_formats: tuple[ToolFormat, ...] = ()
    sectioned = False

    def __init__(self, tokenizer: HFTokenizer) -> None:
        self.tokenizer = tokenizer
        self.hf = tokenizer.hf
        self.encode = tokenizer.encode
        self.special_ids = frozenset(i for i in self.hf.added_tokens_decoder if tokenizer.is_special(i))
        self._special_array = np.array(sorted(self.special_ids), dtype=np.int64)

    @cached_property
    def layout(self) -> Layout:
        """Looked up on first use: counting prompt tokens needs no stop id (the spend plan's tokenizer may
        have none)."""
        return Layout(self.tokenizer.stop_id)

    def prompt_ids(
        self,
        messages: list[Message],
        tools: list[Tool] | None,
        *,
        thinking: bool,
        tool_format: ToolFormat,
    ) -> list[int]:
        return render_prompt_ids(self.hf, messages, tools)

    @cached_property
    def _opening(self) -> list[int]:
        probe = [{"role": "user", "content": "x"}]
        rendered = self.hf.apply_chat_template(
            probe, add_generation_prompt=True, tokenize=True, return_dict=False
        )
        bare = self.hf.apply_chat_template(
            probe, add_generation_prompt=False, tokenize=True, return_dict=False
        )
        return list(rendered[len(bare) :])

    def generation_prompt(self, thinking: bool) -> list[int]:
        return self._opening

    def special_positions(self, ids: list[int]) -> list[int]:
        return np.flatnonzero(np.isin(np.asarray(ids, dtype=np.int64), self._special_array)).tolist()

    def tool_format_name(self, tool_format: ToolFormat) -> str:
        return "chat_template"

    def other_tool_format_lengths(
        self, tools: list[Tool], used: ToolFormat, length: int
    ) -> dict[ToolFormat, int]:
        return {}

    def one_text_answer(self, content: str, tool_calls: list[ToolCall] | None) -> str:
        """The content, tool calls rendered after it as the template renders an assistant turn."""
        segments = self.completion_segments(
            reasoning=None, content=content, tool_calls=tool_calls, truncated=True, thinking=False
        )
        texts = [segment.text for segment in segments if isinstance(segment, Text)]
        if len(texts) != len(segments):  # truncated: no stop id, and ChatML has no other special in a turn
            raise ValueError("a ChatML answer rendered with a special token inside it")
        return "".join(texts)

    def completion_segments(
        self,
        *,
        reasoning: str | None,
        content: str | None,
        tool_calls: list[ToolCall] | None,
        truncated: bool,
        thinking: bool,
    ) -> list[Segment]:
        return chatml.completion_segments(
            self.tokenizer, reasoning=reasoning, content=content, tool_calls=tool_calls, truncated=truncated
        )

    def read_completion(self, ids: list[int], *, thinking: bool, truncated: bool) -> ReadBack | None:
        """One text; special ids other than the stop id are part of it."""
        if self.layout.stop in ids:
            return None
        return ReadBack(content=self.tokenizer.decode(ids), think_end=True)


def chat_format_for(tokenizer: TargetTokenizer) -> ChatFormat:
    """The chat format a tokenizer's target renders with. Chosen here, where both families are known, so
    that the tokenizer modules (which the formats import) import no format."""
    if isinstance(tokenizer, KimiTokenizer):
        return KimiChatFormat(tokenizer)
    if isinstance(tokenizer, HFTokenizer):
        return TemplateChatFormat(tokenizer)
    raise TypeError(f"no chat format for a {type(tokenizer).__name__}")
