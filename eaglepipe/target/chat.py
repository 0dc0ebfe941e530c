"""One rendering of a conversation into the target's prompt ids, shared by every stage.

The emulator (which generates), the token stage (which rebuilds ids) and the spend plan (which counts
prompt tokens) must render the same conversation to the same ids, so for an HF-template target they all
reach `render_prompt_ids` through `chat_format.TemplateChatFormat`.
Templates that know nothing of tools (SmolLM2's ChatML) get the declarations as a system turn, and
assistant tool calls as JSON text, because such a template breaks on a `None` content.
"""

from __future__ import annotations

import json
from typing import Any, TypedDict

from eaglepipe.messages import ContentPart, Message, Tool


class TemplateTurn(TypedDict):
    """A message as the template gets it: tool calls and declarations folded into its text."""

    role: str
    content: str | list[ContentPart]


def template_supports_tools(tokenizer: Any) -> bool:
    return "tools" in (getattr(tokenizer, "chat_template", None) or "")


def normalize_messages(
    tokenizer: Any, messages: list[Message], tools: list[Tool] | None
) -> list[TemplateTurn]:
    """Messages in the shape the tokenizer's template can render."""
    out: list[TemplateTurn] = []
    if tools and not template_supports_tools(tokenizer):
        declared = json.dumps(tools, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
        tool_turn = f"You can call these tools. Answer with a JSON tool call when one helps.\n{declared}"
        if messages and messages[0]["role"] == "system":
            first, *rest = messages
            out.append({"role": "system", "content": f"{first.get('content') or ''}\n\n{tool_turn}"})
            messages = rest
        else:
            out.append({"role": "system", "content": tool_turn})
    for message in messages:
        content = message.get("content") or ""
        calls = message.get("tool_calls")
        if calls and not template_supports_tools(tokenizer):
            rendered = json.dumps(
                [c.get("function", c) for c in calls], ensure_ascii=False, separators=(",", ":")
            )
            content = f"{content}\n{rendered}" if content else rendered
        out.append({"role": message["role"], "content": content})
    return out


def render_prompt_ids(tokenizer: Any, messages: list[Message], tools: list[Tool] | None = None) -> list[int]:
    """Prompt ids including the generation prompt: exactly what the target saw before answering."""
    normalized = normalize_messages(tokenizer, messages, tools)
    kwargs = {"tools": tools} if tools and template_supports_tools(tokenizer) else {}
    ids = tokenizer.apply_chat_template(
        normalized, add_generation_prompt=True, tokenize=True, return_dict=False, **kwargs
    )
    return list(ids)


def stop_token_id(tokenizer: Any) -> int:
    """The id that ends an assistant turn (`<|im_end|>` for ChatML and Kimi)."""
    for name in ("<|im_end|>", tokenizer.eos_token):
        token_id = tokenizer.convert_tokens_to_ids(name)
        if isinstance(token_id, int) and token_id != tokenizer.unk_token_id:
            return token_id
    raise ValueError("tokenizer has no end-of-turn token (<|im_end|> or eos_token)")
