"""The HF-template targets' (SmolLM2's ChatML) completion segments, the same surface as `kimi_chat`'s, for
`chat_format.TemplateChatFormat`; prompts render through `eaglepipe.target.chat`."""

from __future__ import annotations

from eaglepipe.messages import Message, ToolCall
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
    tool_calls: list[ToolCall] | None,
    truncated: bool,
) -> list[Segment]:
    """The answer as the template renders an assistant turn (tool calls as JSON text), then the stop id."""
    if reasoning:
        raise ChatMLError(
            f"{tokenizer.hf.name_or_path}: the reply carries reasoning, which this template cannot hold; "
            "generate without reasoning (generation.reasoning: {enabled: false}) for this target"
        )
    message: Message = {"role": "assistant", "content": content, "tool_calls": tool_calls}
    text = normalize_messages(tokenizer.hf, [message], None)[0]["content"]
    assert isinstance(text, str)  # string content in, so string content out
    segments = text_segment(text, "content")
    return segments if truncated else [*segments, Special(tokenizer.stop_id)]
