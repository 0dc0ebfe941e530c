"""Which answers rebuilt from `/generation/content` may stand in the journal for the one a cut stream lost.

`/generation/content` (GenerationContentData) holds only the completion text and the reasoning text: no
tool calls, no finish reason, no token ids or logprobs. `/generation` adds the finish reason, the provider
and the counts. An answer is rebuilt only where these say everything the token stage reads:
- the prompt offers no tools (a tool call would be missing from the text, and the answer with it);
- `/generation` names a finish reason of `stop` or `length` (anything else: an error, a tool call, a
  cancellation before the end, or no reason at all, leaves the answer unknown);
- the provider is one routing kept (a foreign one would be discarded had the answer arrived);
- no stored error, and reasoning text whenever reasoning tokens were billed (else the reasoning is lost).
Anything else is charged in the ledger (`recovered`) and bought again, as before `/generation/content`.
"""

from __future__ import annotations

from typing import Any

from eaglepipe.openrouter.billing_api import PricedGeneration
from eaglepipe.prompts.records import PromptRecord
from eaglepipe.responses import ReplyFields


def rebuilt_answer(
    prompt: PromptRecord,
    generation: PricedGeneration,
    content: dict[str, Any],
    allowed_providers: frozenset[str],
) -> tuple[ReplyFields | None, str]:
    """(the journal record's answer fields, "") when the stored text is the whole answer, else (None, why)."""
    stored = content.get("output")
    output = stored if isinstance(stored, dict) else {}
    completion, reasoning = output.get("completion"), output.get("reasoning")
    provider, finish_reason = generation.get("provider"), generation.get("finish_reason")
    if prompt.get("tools"):
        return None, "the prompt offers tools, and stored content holds no tool calls"
    if finish_reason not in ("stop", "length"):
        return None, f"finish reason {finish_reason!r} is not stop or length"
    if allowed_providers and str(provider or "").lower() not in allowed_providers:
        return None, f"served by {provider!r}, outside the allowlist"
    if content.get("error") or not isinstance(completion, str):
        return None, "the stored content holds an error or no completion"
    if generation.get("reasoning_tokens") and not reasoning:
        return None, "reasoning tokens were billed but no reasoning text is stored"
    answer: ReplyFields = {
        "response": {
            "content": completion,
            "reasoning": reasoning if isinstance(reasoning, str) and reasoning else None,
            "tool_calls": [],
            "finish_reason": finish_reason,
        },
        "provider": provider,
        "usage": {
            "prompt_tokens": generation.get("prompt_tokens"),
            "completion_tokens": generation.get("completion_tokens"),
            "reasoning_tokens": generation.get("reasoning_tokens") or 0,
            "cost": generation.get("usd"),
        },
    }
    return answer, ""
