"""The target's side of reconstruction: prompt rendering and the special ids a completion is built from.

Two families: Kimi-K2.5 (native tiktoken tokenizer, `reasoning </think> content [tool section] <|im_end|>`)
and HF-template targets such as the embedded SmolLM2 (ChatML: the answer as one text, then `<|im_end|>`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import numpy as np

from eaglepipe.target import chatml, kimi_chat
from eaglepipe.target.hf_tokenizer import HFTokenizer
from eaglepipe.target.kimi_tokenizer import MAX_RUN_CHARS
from eaglepipe.target.kimi_tools import ToolFormat, declare_tools
from eaglepipe.target.segments import encode_segments
from eaglepipe.target.tokenizer import TargetTokenizer

TOOL_FORMATS: tuple[ToolFormat, ...] = ("typescript", "json")


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


class _ShortTextEncoder:
    """Kimi's encoder, skipping its run and window cuts for texts too short to be cut (the same ids): the
    scan for long runs costs as much as a fifth of encoding, for nothing, on chat-sized pieces."""

    def __init__(self, tokenizer: TargetTokenizer) -> None:
        self.full = tokenizer.encode
        self.ordinary = tokenizer.encoding.encode_ordinary  # type: ignore[attr-defined]

    def encode(self, text: str) -> list[int]:
        return self.ordinary(text) if len(text) <= MAX_RUN_CHARS else self.full(text)


class Target:
    """A tokenizer plus its chat format; `kimi` tells the two families apart."""

    def __init__(self, tokenizer: TargetTokenizer) -> None:
        self.tokenizer = tokenizer
        self.kimi = not isinstance(tokenizer, HFTokenizer)
        self._encoder = _ShortTextEncoder(tokenizer) if self.kimi else tokenizer
        self.encode = self._encoder.encode
        self._declarations: dict[tuple[str, str], int] = {}
        self.vocab_size = tokenizer.vocab_size
        self._openings: dict[bool, list[int]] = {}
        if self.kimi:
            markers = kimi_chat.Markers.of(tokenizer)
            self.layout = Layout(
                markers.end,
                markers.think_end,
                markers.section_begin,
                markers.section_end,
                markers.call_begin,
                markers.argument_begin,
                markers.call_end,
            )
            self.num_ranks: int = tokenizer.num_ranks  # type: ignore[attr-defined]
            self.special_ids = frozenset(range(self.num_ranks, tokenizer.vocab_size))
        else:
            self.layout = Layout(tokenizer.stop_id)
            self.num_ranks = tokenizer.vocab_size
            added = tokenizer.hf.added_tokens_decoder  # type: ignore[attr-defined]
            self.special_ids = frozenset(i for i in added if tokenizer.is_special(i))
        self._special_array = np.array(sorted(self.special_ids), dtype=np.int64)

    def prompt_ids(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        *,
        thinking: bool,
        tool_format: ToolFormat,
    ) -> list[int]:
        if self.kimi:
            segments = kimi_chat.prompt_segments(
                self.tokenizer, messages, tools, thinking=thinking, tool_format=tool_format
            )
            return encode_segments(self._encoder, segments)  # type: ignore[arg-type]
        return chatml.prompt_ids(self.tokenizer, messages, tools)  # type: ignore[arg-type]

    def special_positions(self, ids: list[int]) -> list[int]:
        """Where the special ids are, found without a Python loop over the ids."""
        array = np.asarray(ids, dtype=np.int64)
        found = array >= self.num_ranks if self.kimi else np.isin(array, self._special_array)
        return np.flatnonzero(found).tolist()

    def declaration_length(self, tools: list[dict[str, Any]], tool_format: ToolFormat) -> int:
        """Tokens of a Kimi tool declaration; prompts with the same tools share it (the text between
        `<|im_middle|>` and `<|im_end|>` is encoded on its own, so formats differ by exactly this)."""
        key = (json.dumps(tools, sort_keys=True), tool_format)
        if key not in self._declarations:
            self._declarations[key] = len(self.encode(declare_tools(tools, tool_format)))
        return self._declarations[key]

    def generation_prompt(self, thinking: bool) -> list[int]:
        """The ids every rendered prompt ends with: what the target reads right before it answers."""
        if thinking not in self._openings:
            self._openings[thinking] = self._generation_prompt(thinking)
        return self._openings[thinking]

    def _generation_prompt(self, thinking: bool) -> list[int]:
        if self.kimi:
            markers = kimi_chat.Markers.of(self.tokenizer)
            opening = [markers.assistant, *self.tokenizer.encode("assistant"), markers.middle, markers.think]
            return opening if thinking else [*opening, markers.think_end]
        hf = self.tokenizer.hf  # type: ignore[attr-defined]
        probe = [{"role": "user", "content": "x"}]
        with_prompt = hf.apply_chat_template(
            probe, add_generation_prompt=True, tokenize=True, return_dict=False
        )
        bare = hf.apply_chat_template(probe, add_generation_prompt=False, tokenize=True, return_dict=False)
        return list(with_prompt[len(bare) :])

    def chatml_answer(self, content: str, tool_calls: list[dict[str, Any]] | None) -> str:
        """A ChatML target's whole answer as one text: the content, tool calls rendered as its template
        does."""
        segments = chatml.completion_segments(
            self.tokenizer,
            reasoning=None,
            content=content,  # type: ignore[arg-type]
            tool_calls=tool_calls,
            truncated=True,
        )
        return "".join(segment.text for segment in segments)  # type: ignore[union-attr]


def tool_history(messages: list[dict[str, Any]]) -> int:
    """Tool calls already made in the conversation: Kimi numbers the next call's id from here."""
    return sum(len(m.get("tool_calls") or []) for m in messages if m.get("role") == "assistant")
