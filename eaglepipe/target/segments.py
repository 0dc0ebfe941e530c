"""A rendered turn as an ordered list of text pieces and special ids.

The token stage rebuilds a completion from the text the server returned; keeping each piece (reasoning,
content, a tool call's id and arguments) apart lets it re-encode one piece under several normalization
candidates while the special ids between them stay fixed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

from eaglepipe.errors import EaglepipeError

TextKind = Literal[
    "role", "message", "tools", "tool_result", "reasoning", "content", "tool_call_id", "tool_arguments"
]


class RenderError(EaglepipeError, ValueError):
    """A conversation or tool schema a chat format cannot render, in one line."""


@dataclass(frozen=True)
class Text:
    text: str
    kind: TextKind


@dataclass(frozen=True)
class Special:
    id: int


Segment = Text | Special


class Encoder(Protocol):
    """What encodes ordinary text: a `TargetTokenizer`, or a chat format (which may encode its own way)."""

    def encode(self, text: str) -> list[int]: ...


def text_segment(text: str | None, kind: TextKind) -> list[Segment]:
    """No segment for an empty piece, so segment lists compare cleanly."""
    return [Text(text, kind)] if text else []


def encode_segments(tokenizer: Encoder, segments: Sequence[Segment]) -> list[int]:
    """Each run of text between special ids encoded as ordinary text. Adjacent texts are joined first (BPE
    pieces may span them), so this equals encoding the rendered string with specials allowed, except that a
    special-token string inside a text stays text, as the engine's template keeps it."""
    ids: list[int] = []
    run: list[str] = []
    for segment in segments:
        if isinstance(segment, Text):
            run.append(segment.text)
            continue
        ids += tokenizer.encode("".join(run))
        ids.append(segment.id)
        run = []
    return ids + tokenizer.encode("".join(run))
