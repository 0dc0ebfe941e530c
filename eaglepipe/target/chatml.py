"""The HF-template targets' (SmolLM2's ChatML) completion segments, the same surface as `kimi_chat`'s, for
`chat_format.TemplateChatFormat`; prompts render through `eaglepipe.target.chat`."""

from __future__ import annotations

from typing import Any

from eaglepipe.target.chat import normalize_messages
from eaglepipe.target.hf_tokenizer import HFTokenizer
from eaglepipe.target.segments import RenderError, Segment, Special, text_segment


class ChatMLError(RenderError):
    """A reply an HF-template target cannot hold, in one line."""


def completion_segments(
    tokenizer: HFTokenizer,
    *,
    reasoning: str | None,
    content: str | None,
    tool_calls: list[dict[str, Any]] | None,
    truncated: bool,
) -> list[Segment]:
    """The answer as the template renders an assistant turn (tool calls as JSON text), then the stop id."""
    if reasoning:
        raise ChatMLError(
            f"{tokenizer.hf.name_or_path}: the reply carries reasoning, which this template cannot hold; "
            "generate without reasoning (generation.reasoning: {enabled: false}) for this target"
        )
    message = {"role": "assistant", "content": content, "tool_calls": tool_calls}
    text = normalize_messages(tokenizer.hf, [message], None)[0]["content"]
    segments = text_segment(text, "content")
    return segments if truncated else [*segments, Special(tokenizer.stop_id)]
