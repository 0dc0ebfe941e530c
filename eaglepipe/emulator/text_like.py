"""What serving engines make of a completion's ids: the text, reasoning and tool calls they return.

Providers hand back text, not ids, and the text is not quite what the model generated. What vLLM 0.32 and
SGLang 0.5.14 do was read from their own code (`tests/support/engines`, docs/tokens.md): vLLM's Kimi
parser strips the reasoning's end, drops content that is only whitespace before a tool section and trims
arguments (`vllm`); SGLang's renumbers tool-call ids after the conversation's earlier calls (non-streamed:
plus the model's own number) and trims arguments (`sglang`). Two habits of other set-ups stay as switches:
vLLM's detokenizer joins text and markers with spaces when the tokenizer registers the markers as added
tokens (`vllm_spaced`), and an older SGLang stripped reasoning and content (`sglang_stripping`). Bills
differ in whether they count the stop token. These switches imitate that as pure functions of the true
ids, so the emulator can serve such text (`--text-like`) and the token stage's ground-truth tests can check
reconstruction against it. This module and `eaglepipe.tokens` import nothing from each other (only the
tests join them), so the two sides stay independent implementations of the same behaviour. They do not
imitate the rarer habits (a special token's spelling dropped from text, a cut-off call returned, streamed
SGLang's whitespace after arguments).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from eaglepipe.chat_api import Logprobs
from eaglepipe.messages import ToolCall
from eaglepipe.responses import ResponseBody
from eaglepipe.target.tokenizer import TargetTokenizer, TokenizerError

Whitespace = Literal["keep", "pad", "strip", "rstrip"]
THINK_END = "</think>"
SECTION_BEGIN = "<|tool_calls_section_begin|>"
# vLLM's Kimi-K2 tool-call pattern: the id and (when trimming) the arguments lose surrounding whitespace.
_TRIMMED_CALL = re.compile(
    r"<\|tool_call_begin\|>\s*(?P<id>.+?)\s*<\|tool_call_argument_begin\|>\s*(?P<arguments>.*?)\s*"
    r"<\|tool_call_end\|>",
    re.DOTALL,
)
_KIMI_ID = re.compile(r"functions\.[^:]+:(\d+)")
_KEPT_CALL = re.compile(
    r"<\|tool_call_begin\|>\s*(?P<id>.+?)\s*<\|tool_call_argument_begin\|>(?P<arguments>.*?)<\|tool_call_end\|>",
    re.DOTALL,
)


@dataclass(frozen=True)
class EngineSwitch:
    """One engine's habits. `pad` parses the tool section with vLLM's pattern, which trims arguments."""

    name: str
    skip_special_tokens: bool = True
    whitespace: Whitespace = "keep"
    renumber_tool_ids: bool = False
    # Renumbered after the earlier calls plus: the call's position (SGLang streamed, older SGLang) or the
    # model's own number (SGLang's non-streamed replies).
    renumber_from: Literal["position", "model"] = "position"
    trim_arguments: bool = False
    bills_stop_token: bool = True
    returns_token_ids: bool = False
    returns_logprobs: bool = False
    prompt_tool_format: Literal["typescript", "json"] = "typescript"
    injected_prompt_tokens: int = 0  # a system prompt the provider adds, billed but never seen by us

    def __post_init__(self) -> None:
        if self.whitespace == "pad" and not self.trim_arguments:
            raise ValueError(f"switch {self.name}: a padding engine's tool parser trims arguments")


VLLM = EngineSwitch("vllm", whitespace="rstrip", trim_arguments=True)
SGLANG = EngineSwitch("sglang", renumber_tool_ids=True, renumber_from="model", trim_arguments=True)
SWITCHES: dict[str, EngineSwitch] = {
    s.name: s
    for s in (
        EngineSwitch("exact", skip_special_tokens=False),
        VLLM,
        EngineSwitch("vllm_ids", whitespace="rstrip", trim_arguments=True, returns_token_ids=True),
        EngineSwitch("vllm_logprobs", whitespace="rstrip", trim_arguments=True, returns_logprobs=True),
        EngineSwitch("vllm_spaced", whitespace="pad", trim_arguments=True),
        SGLANG,
        EngineSwitch(
            "sglang_ids",
            renumber_tool_ids=True,
            renumber_from="model",
            trim_arguments=True,
            returns_token_ids=True,
        ),
        EngineSwitch("sglang_stripping", whitespace="strip", renumber_tool_ids=True, trim_arguments=True),
        EngineSwitch(
            "sglang_stripping_ids",
            whitespace="strip",
            renumber_tool_ids=True,
            trim_arguments=True,
            returns_token_ids=True,
        ),
        EngineSwitch("unbilled_stop", bills_stop_token=False),
        EngineSwitch("json_tools_system_prompt", prompt_tool_format="json", injected_prompt_tokens=9),
    )
}
# What `python -m eaglepipe.emulator --text-like` offers.
SERVED_SWITCHES = ("exact", "vllm", "vllm_spaced", "sglang", "sglang_stripping")


@dataclass(frozen=True)
class EngineReply:
    reasoning: str | None
    content: str
    tool_calls: list[ToolCall]
    finish_reason: str
    completion_tokens: int
    token_ids: list[int] | None
    logprobs: Logprobs | None

    def response(self) -> ResponseBody:
        """The `response` of a responses.jsonl record."""
        body: ResponseBody = {
            "content": self.content,
            "reasoning": self.reasoning,
            "tool_calls": self.tool_calls,
            "finish_reason": self.finish_reason,
        }
        if self.token_ids is not None:
            body["token_ids"] = self.token_ids
        if self.logprobs is not None:
            body["logprobs"] = self.logprobs
        return body


def kept_markers(tokenizer: TargetTokenizer) -> frozenset[int]:
    """The special ids a decoder that skips special tokens still writes: those Moonshot's config marks
    `special: false` (`</think>`, the tool markers). Other targets have none of them. Imported here: the
    layout module pulls in tiktoken and regex, which the tests' synthetic emulator's start does without."""
    from eaglepipe.target.kimi_layout import NOT_HF_SPECIAL

    kept = set()
    for name in NOT_HF_SPECIAL:
        try:
            kept.add(tokenizer.special_id(name))
        except TokenizerError:
            continue
    return frozenset(kept)


def detokenize(tokenizer: TargetTokenizer, ids: Sequence[int], switch: EngineSwitch) -> str:
    """The engine's text of `ids`: runs of ordinary ids decoded, special ids skipped or written, the parts
    joined with a space when the engine pads (HF's `_decode` and vLLM's detokenizer do the same)."""
    kept = kept_markers(tokenizer)
    parts: list[str] = []
    run: list[int] = []
    for token_id in ids:
        if not tokenizer.is_special(token_id):
            run.append(token_id)
        elif not switch.skip_special_tokens or token_id in kept:
            if run and (text := tokenizer.decode(run)):
                parts.append(text)
            run = []
            parts.append(tokenizer.decode([token_id]))
    if run and (text := tokenizer.decode(run)):
        parts.append(text)
    return (" " if switch.whitespace == "pad" else "").join(parts)


def engine_reply(
    tokenizer: TargetTokenizer,
    ids: Sequence[int],
    switch: EngineSwitch,
    *,
    stopped: bool,
    thinking: bool,
    tool_history: int = 0,
) -> EngineReply:
    """`ids`: what the model generated, without the stop token (`stopped` says whether it followed)."""
    text = detokenize(tokenizer, ids, switch)
    closed = THINK_END in text or SECTION_BEGIN in text  # something followed the reasoning
    section = SECTION_BEGIN in text
    reasoning: str | None = None
    if thinking:
        reasoning, text = split_reasoning(text)
    content, tool_calls = (
        split_tool_calls(text, switch, tool_history) if kept_markers(tokenizer) else (text, [])
    )
    if switch.whitespace == "strip":
        reasoning = reasoning.strip() if reasoning is not None else None
        content = content.strip()
    elif switch.whitespace == "rstrip":
        reasoning = reasoning.rstrip() if reasoning is not None and closed else reasoning
        content = "" if section and not content.strip() else content
    logprobs: Logprobs | None = None
    if switch.returns_logprobs:
        entries = [tokenizer.token_bytes(i) for i in ids]
        logprobs = {
            "content": [
                {
                    "token": raw.decode("utf-8", "replace"),
                    "bytes": list(raw),
                    "logprob": 0.0,
                    "top_logprobs": [],
                }
                for raw in entries
            ]
        }
    return EngineReply(
        reasoning=reasoning or None,
        content=content,
        tool_calls=tool_calls,
        finish_reason="stop" if stopped else "length",
        completion_tokens=len(ids) + int(stopped and switch.bills_stop_token),
        token_ids=list(ids) if switch.returns_token_ids else None,
        logprobs=logprobs,
    )


def split_reasoning(text: str) -> tuple[str, str]:
    """At the first `</think>`; without one, at the tool section (vLLM), else all of it is reasoning."""
    if THINK_END in text:
        reasoning, _, rest = text.partition(THINK_END)
        return reasoning, rest
    cut = text.find(SECTION_BEGIN)
    return (text[:cut], text[cut:]) if cut >= 0 else (text, "")


def split_tool_calls(text: str, switch: EngineSwitch, tool_history: int) -> tuple[str, list[ToolCall]]:
    """Content is the text before the tool section; the section's complete calls become tool calls (a call
    cut off by the length limit, and text between calls, are dropped)."""
    cut = text.find(SECTION_BEGIN)
    if cut < 0:
        return text, []
    pattern = _TRIMMED_CALL if switch.trim_arguments else _KEPT_CALL
    calls: list[ToolCall] = []
    for index, match in enumerate(pattern.finditer(text, cut)):
        model_id = match["id"]
        name = model_id.split(":")[0].split(".")[-1]
        own = _KIMI_ID.fullmatch(model_id)
        number = int(own[1]) if own and switch.renumber_from == "model" else index
        call_id = f"functions.{name}:{tool_history + number}" if switch.renumber_tool_ids else model_id
        calls.append(
            {"id": call_id, "type": "function", "function": {"name": name, "arguments": match["arguments"]}}
        )
    return text[:cut], calls
