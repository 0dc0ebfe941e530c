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

from eaglepipe.target.tokenizer import TokenizerError
from eaglepipe.tokens.normalize import WHITESPACE_MODES, padded
from eaglepipe.tokens.reply import Reply
from eaglepipe.tokens.target import Target


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


@dataclass
class _Read:
    """Completion ids read back the way an engine splits them."""

    reasoning: str = ""
    think_end: bool = False
    content: str = ""
    section: bool = False
    calls: list[tuple[str, str]] | None = None


def ids_from_bytes(target: Target, pieces: Sequence[bytes]) -> list[int] | None:
    """Each logprob entry's bytes as its id; None when a piece is no token or names two."""
    table = _bytes_table(target)
    ids = [table.get(piece, -1) for piece in pieces] if table else [-1]
    return None if -1 in ids else ids


@cache
def _bytes_table(target: Target) -> dict[bytes, int]:
    """bytes -> id over the vocabulary; bytes shared by two ids map to -1 (no answer)."""
    table: dict[bytes, int] = {}
    try:
        for token_id in range(target.vocab_size):
            raw = target.tokenizer.token_bytes(token_id)
            table[raw] = -1 if raw in table else token_id
    except TokenizerError:
        return {}
    return table


def exact_completion(target: Target, reply: Reply, ids: Sequence[int], history: int) -> ExactIds | None:
    """The ids as the sample's completion when they agree with the reply's text, else None."""
    ids = list(ids)
    if ids and ids[-1] == target.layout.stop:  # some servers include the stop token
        ids.pop()
    read = _read_kimi(target, ids, reply) if target.kimi else _read_chatml(target, ids)
    if read is None:
        return None
    observation = _compare(target, reply, read, history)
    if observation is None:
        return None
    stop_billed = None
    if not reply.truncated and reply.billed_completion is not None:
        stop_billed = {len(ids) + 1: True, len(ids): False}.get(reply.billed_completion)
    observation = Observation(
        observation.whitespace, stop_billed, observation.renumbered, observation.trimmed
    )
    return ExactIds(ids if reply.truncated else [*ids, target.layout.stop], observation)


def _read_chatml(target: Target, ids: list[int]) -> _Read | None:
    if target.layout.stop in ids:
        return None
    return _Read(content=target.tokenizer.decode(ids), think_end=True)


def _read_kimi(target: Target, ids: list[int], reply: Reply) -> _Read | None:
    """Walk the ids as `reasoning </think> content [section] ...`; None on a special id out of place. A
    call cut off by the length limit is left out (engines return it, or not; `_compare` allows both)."""
    layout, decode = target.layout, target.tokenizer.decode
    read = _Read(think_end=not reply.thinking, calls=[])
    state, call_id = ("reasoning" if reply.thinking else "content"), ""
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
    for position in [*target.special_positions(ids), None]:
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
            read.calls.append((call_id, text))  # type: ignore[union-attr]
            call_id = ""
        elif text and state == "closed":
            return None
        if token_id is None:
            break
        state = transitions.get((state, token_id))  # type: ignore[assignment]
        if state is None:
            return None
        read.think_end |= token_id == layout.think_end
        read.section |= token_id == layout.section_begin
    if state in ("id", "arguments") and not reply.truncated:
        return None
    return read


def _compare(target: Target, reply: Reply, read: _Read, history: int) -> Observation | None:
    before_section = read.section
    modes = _modes(reply.content, read.content, reply.thinking and read.think_end, before_section)
    if reply.thinking:
        modes &= _modes(
            reply.reasoning, read.reasoning, False, read.think_end or read.section, reasoning=True
        )
    elif reply.reasoning:
        return None
    if not target.kimi:
        modes &= {"keep", "strip"}
    calls = read.calls or []
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
