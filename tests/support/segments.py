"""Segments as one string, for the tests that compare a rendering with a chat template's."""

from __future__ import annotations

from collections.abc import Sequence

from eaglepipe.target.segments import Segment, Text
from eaglepipe.target.tokenizer import TargetTokenizer


def segments_text(tokenizer: TargetTokenizer, segments: Sequence[Segment]) -> str:
    """The rendered string, special ids written as their names (what a Jinja template would produce)."""
    return "".join(s.text if isinstance(s, Text) else tokenizer.decode([s.id]) for s in segments)
