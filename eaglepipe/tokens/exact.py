"""Exact ids from the server (`token_ids`, or logprob `bytes` mapped to ranks), trusted only after they are
read back into reasoning, content and tool calls that agree with the returned text.

"Agree" allows exactly what engines do to text (`normalize`, and what the engine harness read from vLLM's
and SGLang's own code: a stripped reasoning end, whitespace-only content dropped, a cut-off call
returned), and what the comparison shows is kept as evidence about the provider: how it treats
whitespace, whether it renumbers tool ids or trims arguments, whether its bill counts the stop token.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache

from eaglepipe.target.chat_format import ChatFormat, ReadBack
from eaglepipe.target.tokenizer import TokenizerError
from eaglepipe.tokens.normalize import WHITESPACE_MODES, padded
from eaglepipe.tokens.reply import Reply


@dataclass(frozen=True)
class Observation:
    whitespace: frozenset[str]  # the engine readings that turn the ids' text into the returned text
    stop_billed: bool | None
    renumbered: bool | None
    trimmed: bool | None


@dataclass(frozen=True)
class ExactIds:
    ids: list[int]  # the completion, with the stop token when the reply stopped
    observation: Observation


def ids_from_bytes(chat: ChatFormat, pieces: Sequence[bytes]) -> list[int] | None:
    """Each logprob entry's bytes as its id; None when a piece is no token or names two."""
    table = _bytes_table(chat)
    ids = [table.get(piece, -1) for piece in pieces] if table else [-1]
    return None if -1 in ids else ids


@cache
def _bytes_table(chat: ChatFormat) -> dict[bytes, int]:
    """bytes -> id over the vocabulary; bytes shared by two ids map to -1 (no answer)."""
    table: dict[bytes, int] = {}
    try:
        for token_id in range(chat.tokenizer.vocab_size):
            raw = chat.tokenizer.token_bytes(token_id)
            table[raw] = -1 if raw in table else token_id
    except TokenizerError:
        return {}
    return table


def exact_completion(
    chat: ChatFormat, reply: Reply, ids: Sequence[int], history: int, whitespace: frozenset[str]
) -> ExactIds | None:
    """The ids as the sample's completion when they agree with the reply's text under one of the engine
    readings in `whitespace` (those the format's text can show), else None."""
    ids = _without_stop(chat, ids)
    read = chat.read_completion(ids, thinking=reply.thinking, truncated=reply.truncated)
    if read is None:
        return None
    observation = _compare(reply, read, history, whitespace)
    if observation is None:
        return None
    stop_billed = None
    if not reply.truncated and reply.billed_completion is not None:
        stop_billed = {len(ids) + 1: True, len(ids): False}.get(reply.billed_completion)
    observation = Observation(
        observation.whitespace, stop_billed, observation.renumbered, observation.trimmed
    )
    return ExactIds(with_stop(chat, ids, reply.truncated), observation)


def with_stop(chat: ChatFormat, ids: Sequence[int], truncated: bool) -> list[int]:
    """Server ids as a sample's completion: the stop token once at the end unless the reply was cut off."""
    ids = _without_stop(chat, ids)
    return ids if truncated else [*ids, chat.layout.stop]


def _without_stop(chat: ChatFormat, ids: Sequence[int]) -> list[int]:
    ids = list(ids)
    if ids and ids[-1] == chat.layout.stop:  # some servers include the stop token
        ids.pop()
    return ids


def _compare(reply: Reply, read: ReadBack, history: int, whitespace: frozenset[str]) -> Observation | None:
    before_section = read.section
    modes = _modes(reply.content, read.content, reply.thinking and read.think_end, before_section)
    if reply.thinking:
        modes &= _modes(
            reply.reasoning, read.reasoning, False, read.think_end or read.section, reasoning=True
        )
    elif reply.reasoning:
        return None
    modes &= whitespace
    calls = read.calls
    returned_calls = reply.tool_calls
    if reply.truncated and len(returned_calls) == len(calls) + 1:
        returned_calls = returned_calls[:-1]  # the call the length limit cut off, returned (vLLM, SGLang)
    if not modes or len(calls) != len(returned_calls):
        return None
    renumbered: set[bool] = set()
    trimmed: set[bool] = set()
    for index, ((model_id, arguments), call) in enumerate(zip(calls, returned_calls, strict=True)):
        if call.arguments == arguments:
            trimmed |= {False} if arguments != arguments.strip() else set()
        elif call.arguments == arguments.strip():
            trimmed.add(True)
        else:
            return None
        if call.id != model_id.strip():
            number = model_id.strip().rsplit(":", 1)[-1]
            # After the earlier calls plus the position, or plus the model's own number (SGLang).
            shifted = f"functions.{call.name}:{history + int(number)}" if number.isdecimal() else None
            renumbered |= (
                {True} if call.id in (f"functions.{call.name}:{history + index}", shifted) else set()
            )
        elif model_id != f"functions.{call.name}:{history + index}":
            renumbered.add(False)
    return Observation(frozenset(modes), None, _one(renumbered), _one(trimmed))


def _modes(
    returned: str, generated: str, after_marker: bool, before_marker: bool, *, reasoning: bool = False
) -> set[str]:
    if reasoning:  # vLLM's Kimi parser strips the reasoning's end
        rstripped = generated.rstrip() if before_marker else generated
    else:  # and drops content that is only whitespace
        rstripped = "" if before_marker and not generated.strip() else generated
    rendered = {
        "keep": generated,
        "pad": padded(generated, after_marker, before_marker),
        "strip": generated.strip(),
        "rstrip": rstripped,
    }
    return {mode for mode in WHITESPACE_MODES if rendered[mode] == returned}


def _one(values: set[bool]) -> bool | None:
    return next(iter(values)) if len(values) == 1 else None
