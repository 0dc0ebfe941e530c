"""Candidate readings of a reply and the choice by the billed count.

A reading is a structure (which markers were generated) plus a whitespace reading of the provider's engine
(`normalize`), laid out as fixed special ids and text slots; each slot has a few options (the piece as
returned, a space dropped, whitespace put back, another tool-call id). Every piece is encoded once
(`pieces.Piece`); an option's length costs a re-encode of a few characters. A small dynamic programme
over the slots counts the combinations whose length equals the bill:

- exactly one: `rebuilt_count_matched`;
- several: `rebuilt_ambiguous`, the flags naming the parts that differ, the ids those of the preferred one;
- none: `rebuilt_off_by_k`, the preferred reading, `billed_diff` = its length minus the bill.

Preference (lowest cost first): the provider's known normalization undone before the text as returned;
then the usual structure (`</think>` present when anything follows it; for a cut-off reply, no marker after
the last text); then fewer and likelier whitespace restorations (`normalize.RESTORABLE` order); then the
tool-call id as returned before a renumbering from 0.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from eaglepipe.target.chat_format import ChatFormat, SectionMarkers
from eaglepipe.tokens.methods import Flag, Method
from eaglepipe.tokens.normalize import WHITESPACE_MODES, restore_edits, restore_trail_edits, unpad_edit
from eaglepipe.tokens.pieces import NO_EDIT, Edit, Piece
from eaglepipe.tokens.profile import EngineProfile
from eaglepipe.tokens.reply import Reply, ToolCall

KIMI_TOOL_ID = re.compile(r"functions\.[^:]+:\d+")
KNOWN_SOURCES = ("config", "exact_ids")  # a profile field decided by these is known, not a default
# Costs: a whitespace reading outranks a structure, which outranks the options inside slots.
READING_COST = 1000
STRUCTURE_COST = 100


@dataclass(frozen=True)
class Option:
    piece: Piece
    edit: Edit
    cost: int

    def count(self) -> int:
        return self.piece.count(self.edit)


@dataclass(frozen=True)
class Slot:
    flag: Flag  # the ambiguity this slot stands for when two of its options fit the bill
    options: tuple[Option, ...]


Item = int | Slot


@dataclass
class Variant:
    items: list[Item]
    cost: int
    reading: tuple[str, str]  # (structure, whitespace), to name what differs between fitting variants
    stop: bool
    forced: Flag = Flag(0)  # doubts no count can settle (a rewritten tool id, U+FFFD)


@dataclass(frozen=True)
class Selection:
    ids: list[int]
    method: Method
    flags: Flag
    billed_diff: int  # the chosen reading's billable length minus the bill (0 when it fits or no bill)
    # Where the structure has another reading (several variants, slots with several options, or a doubt
    # no count settles): what a reply that misses its bill may have lost besides its text's split.
    doubts: Flag = Flag(0)


@dataclass
class _Solved:
    """One variant's dynamic programme against the bill."""

    variant: Variant
    ways: int = 0  # combinations of the billed length, capped at 2
    best_cost: float = math.inf
    choice: list[int] = field(default_factory=list)
    ambiguous_slots: Flag = Flag(0)


class PieceCache:
    """One `Piece` per distinct text in a reply: readings share encodings."""

    def __init__(self, chat: ChatFormat) -> None:
        self.encode = chat.encode
        self.pieces: dict[str, Piece] = {}

    def __call__(self, text: str) -> Piece:
        if text not in self.pieces:
            self.pieces[text] = Piece(text, self.encode)
        return self.pieces[text]


def whitespace_slot(
    piece: Piece, reading: str, after_marker: bool, before_marker: bool, *, reasoning: bool = False
) -> Slot | None:
    """The options of a reasoning or content piece under one reading; None when the reading cannot have
    produced this text (padding that is not there)."""
    if reading == "strip":
        options = tuple(Option(piece, edit, cost) for edit, cost in restore_edits(piece.text))
    elif reading == "rstrip" and before_marker and (reasoning or not piece.text):
        edits = restore_trail_edits() if reasoning else restore_edits(piece.text)  # blank content: dropped
        options = tuple(Option(piece, edit, cost) for edit, cost in edits)
    elif reading == "pad":
        edit = unpad_edit(piece.text, after_marker, before_marker)
        if edit is None:
            return None
        options = (Option(piece, edit, 0),)
    else:
        options = (Option(piece, NO_EDIT, 0),)
    return Slot(Flag.WHITESPACE, options)


def argument_slot(piece: Piece, profile: EngineProfile) -> Slot:
    if profile.arguments == "trim":
        return Slot(Flag.ARGUMENTS, tuple(Option(piece, e, c) for e, c in restore_edits(piece.text)))
    return Slot(Flag.ARGUMENTS, (Option(piece, NO_EDIT, 0),))


def id_slot(
    call: ToolCall, index: int, history: int, profile: EngineProfile, pieces: PieceCache
) -> tuple[Slot, Flag]:
    """The model's own id. As returned when the engine is known to keep ids (config or exact ids); else
    Kimi's convention (counting the conversation's earlier calls), a numbering restarted at this reply, and
    the returned number less the earlier calls (SGLang's non-streamed replies add the earlier calls to the
    model's own number); for an engine not known either way, the id as returned first, with those standing
    beside it. The bill decides where their lengths differ; where they do not, the id is flagged
    (`tool_id`), since another numbering explains the reply as well."""
    conventional = f"functions.{call.name}:{history + index}"
    restarted = f"functions.{call.name}:{index}"
    kimi_form = KIMI_TOOL_ID.fullmatch(call.id) is not None
    kept = profile.tool_ids == "keep" and profile.sources.get("tool_ids") in KNOWN_SOURCES
    if kimi_form and kept:
        return Slot(Flag.TOOL_ID, (Option(pieces(call.id), NO_EDIT, 0),)), Flag(0)
    returned = [call.id] if kimi_form and profile.tool_ids == "keep" else []
    number = int(call.id.rsplit(":", 1)[1]) if kimi_form else -1
    unshifted = [f"functions.{call.name}:{number - history}"] if number >= history else []
    ids = dict.fromkeys([*returned, conventional, restarted, *unshifted])
    options = tuple(Option(pieces(text), NO_EDIT, cost) for cost, text in enumerate(ids))
    return Slot(Flag.TOOL_ID, options), Flag(0) if kimi_form else Flag.TOOL_ID


def kimi_structures(reply: Reply, reading: str) -> list[tuple[str, bool, bool, int]]:
    """(name, `</think>` generated, one more marker after the last text, cost) of each plausible structure.
    `</think>` is in doubt only when nothing was returned after it: a cut-off reply more likely ended in
    its reasoning, unless a padding engine left the space it puts before `</think>`. A cut-off reply may
    also have ended just after the next marker (the tool section's start, or its end after the last call)."""
    if not reply.thinking:
        think_ends = [(True, 0)]  # the prompt closed thinking; `True` only means "not inside reasoning"
    elif reply.content:
        think_ends = [(True, 0)]
    else:
        padded_end = reading == "pad" and reply.reasoning.endswith(" ")
        absent_first = reply.truncated and not reply.tool_calls and not padded_end
        think_ends = [(not absent_first, 0), (absent_first, 1)]
    extras = [(False, 0), (True, 1)] if reply.truncated else [(False, 0)]
    return [
        (f"think_end={t},extra={e}", t, e, tc + ec)
        for t, tc in think_ends
        for e, ec in extras
        if not (e and not t and not reply.tool_calls)
    ]


def kimi_variants(
    reply: Reply, chat: ChatFormat, profile: EngineProfile, history: int, pieces: PieceCache
) -> list[Variant]:
    layout = chat.layout.sections()
    readings = [r for r in profile.whitespace if not (r == "keep" and "strip" in profile.whitespace)]
    forced = Flag.REPLACEMENT_CHARACTER if any("\ufffd" in text for text in reply.texts) else Flag(0)
    tool_items: list[Item] = []
    for index, call in enumerate(reply.tool_calls):
        slot, call_forced = id_slot(call, index, history, profile, pieces)
        forced |= call_forced
        tool_items += [
            layout.call_begin,
            slot,
            layout.argument_begin,
            argument_slot(pieces(call.arguments), profile),
            layout.call_end,
        ]
    variants = _kimi_readings(reply, layout, readings, tool_items, pieces, forced)
    if not variants:  # the text contradicts the provider's known padding: read it as returned, in doubt
        variants = _kimi_readings(reply, layout, ["keep"], tool_items, pieces, forced | Flag.WHITESPACE)
    return variants


def _kimi_readings(
    reply: Reply,
    layout: SectionMarkers,
    readings: list[str],
    tool_items: list[Item],
    pieces: PieceCache,
    forced: Flag,
) -> list[Variant]:
    variants: list[Variant] = []
    seen: set[tuple] = set()
    for rank, reading in enumerate(readings):
        for name, think_end, extra, structure_cost in kimi_structures(reply, reading):
            items = _kimi_items(reply, layout, reading, think_end, extra, tool_items, pieces)
            if items is None:
                continue
            key = tuple(
                tuple((o.piece.text, o.edit) for o in i.options) if isinstance(i, Slot) else i for i in items
            )
            if key in seen:
                continue
            seen.add(key)
            variants.append(
                Variant(
                    items,
                    rank * READING_COST + structure_cost * STRUCTURE_COST,
                    (name, reading),
                    not reply.truncated,
                    forced,
                )
            )
    return variants


def _kimi_items(
    reply: Reply,
    layout: SectionMarkers,
    reading: str,
    think_end: bool,
    extra: bool,
    tool_items: list[Item],
    pieces: PieceCache,
) -> list[Item] | None:
    """`reasoning </think> content [tool section] <|im_end|>` for one structure and reading."""
    calls = bool(reply.tool_calls)
    section = calls or (extra and think_end)  # the tool section was opened
    items: list[Item] = []
    if reply.thinking:
        reasoning = whitespace_slot(
            pieces(reply.reasoning), reading, False, think_end or calls, reasoning=True
        )
        if reasoning is None:
            return None
        items.append(reasoning)
        if think_end:
            items.append(layout.think_end)
    if think_end:
        content = whitespace_slot(pieces(reply.content), reading, reply.thinking, section)
        if content is None:
            return None
        items.append(content)
    if section:
        items.append(layout.section_begin)
        items += tool_items
        if calls and (not reply.truncated or extra):
            items.append(layout.section_end)
    if not reply.truncated:
        items.append(layout.stop)
    return items


def chatml_variants(
    reply: Reply, chat: ChatFormat, profile: EngineProfile, history: int, pieces: PieceCache
) -> list[Variant]:
    """One text, then the stop id: only whitespace at its ends can be in doubt (nothing pads it)."""
    answer, truncated = reply.content, reply.truncated
    forced = Flag.REPLACEMENT_CHARACTER if "\ufffd" in answer else Flag(0)
    readings = ["strip"] if "strip" in profile.whitespace else ["keep"]
    variants = []
    for reading in readings:
        slot = whitespace_slot(pieces(answer), reading, False, False)
        assert slot is not None  # only padding can refuse a text
        items: list[Item] = [slot] if truncated else [slot, chat.layout.stop]
        variants.append(Variant(items, 0, ("answer", reading), not truncated, forced))
    return variants


@dataclass(frozen=True)
class Shape:
    """How the token stage reads a completion of the target's chat format."""

    whitespace: frozenset[str]  # the engine readings (`normalize`) its text can show
    variants: Callable[[Reply, ChatFormat, EngineProfile, int, PieceCache], list[Variant]]


# Kimi's sections: markers an engine pads or strips around. A template's one text: nothing pads it, and
# no reasoning parser strips its end alone.
SECTIONED = Shape(frozenset(WHITESPACE_MODES), kimi_variants)
ONE_TEXT = Shape(frozenset({"keep", "strip"}), chatml_variants)


def shape_of(chat_format: ChatFormat) -> Shape:
    return SECTIONED if chat_format.sectioned else ONE_TEXT


def select(variants: Sequence[Variant], billed: int | None, stop_billed: bool) -> Selection:
    """The reading the bill supports (see the module docstring for the rules and the preference)."""
    solved = [_solve(v, billed, stop_billed) for v in variants] if billed is not None else []
    fitting = [s for s in solved if s.ways]
    if not fitting:
        best = min(
            variants,
            key=lambda v: (
                v.cost + sum(min(o.cost for o in i.options) for i in v.items if isinstance(i, Slot))
            ),
        )
        choice = [
            min(range(len(i.options)), key=[o.cost for o in i.options].__getitem__)
            for i in best.items
            if isinstance(i, Slot)
        ]
        ids = _ids(best, choice)
        if billed is None:
            return Selection(ids, Method.REBUILT_AMBIGUOUS, Flag.NO_BILLED_COUNT | best.forced, 0)
        diff = len(ids) - int(best.stop and not stop_billed) - billed
        return Selection(ids, Method.REBUILT_OFF_BY_K, best.forced, diff, _doubts(variants))
    chosen = min(fitting, key=lambda s: s.variant.cost + s.best_cost)
    flags = chosen.variant.forced
    for solution in fitting:
        flags |= solution.ambiguous_slots
    if len(fitting) > 1:
        readings = {s.variant.reading for s in fitting}
        if len({r[0] for r in readings}) > 1:
            flags |= Flag.STRUCTURE
        if len({r[1] for r in readings}) > 1:
            flags |= Flag.WHITESPACE
    ways = sum(s.ways for s in fitting)
    method = Method.REBUILT_COUNT_MATCHED if ways == 1 and not flags else Method.REBUILT_AMBIGUOUS
    return Selection(_ids(chosen.variant, chosen.choice), method, flags, 0)


def _doubts(variants: Sequence[Variant]) -> Flag:
    """The parts of a reply that have more than one reading: other structures or engine readings, slots
    with several options, and doubts no count can settle."""
    doubts = Flag(0)
    for variant in variants:
        doubts |= variant.forced
        for item in variant.items:
            if isinstance(item, Slot) and len(item.options) > 1:
                doubts |= item.flag
    if len({v.reading[0] for v in variants}) > 1:
        doubts |= Flag.STRUCTURE
    if len({v.reading[1] for v in variants}) > 1:
        doubts |= Flag.WHITESPACE
    return doubts


def _solve(variant: Variant, billed: int, stop_billed: bool) -> _Solved:
    """Count the option combinations whose billable length is `billed`; keep the cheapest and which slots
    have more than one option among the fitting combinations."""
    slots = [i for i in variant.items if isinstance(i, Slot)]
    fixed = len(variant.items) - len(slots)
    target = billed - fixed + int(variant.stop and not stop_billed)
    counts = [[o.count() for o in slot.options] for slot in slots]
    # forward[i]: total after i slots -> (ways capped at 2, cheapest cost, (previous total, option))
    forward: list[dict[int, tuple[int, float, tuple[int, int] | None]]] = [{0: (1, 0.0, None)}]
    for slot, slot_counts in zip(slots, counts, strict=True):
        layer: dict[int, tuple[int, float, tuple[int, int] | None]] = {}
        for total, (ways, cost, _) in forward[-1].items():
            for k, option in enumerate(slot.options):
                key = total + slot_counts[k]
                old_ways, old_cost, old_back = layer.get(key, (0, math.inf, None))
                new_cost = cost + option.cost
                back = (total, k) if new_cost < old_cost else old_back
                layer[key] = (min(2, old_ways + ways), min(old_cost, new_cost), back)
        forward.append(layer)
    result = _Solved(variant)
    if target not in forward[-1]:
        return result
    result.ways, result.best_cost, _ = forward[-1][target]
    total = target
    for position in range(len(slots), 0, -1):
        back = forward[position][total][2]
        assert back is not None, "every total reached after a slot has a way back"
        previous, k = back
        result.choice.append(k)
        total = previous
    result.choice.reverse()
    if result.ways > 1:
        result.ambiguous_slots = _ambiguous_slots(slots, counts, forward, target)
    return result


def _ambiguous_slots(slots: list[Slot], counts: list[list[int]], forward: list[dict], target: int) -> Flag:
    """The flags of slots where two different options each lie in some combination of the billed length."""
    backward: list[set[int]] = [set() for _ in range(len(slots) + 1)]
    backward[-1] = {0}
    for position in range(len(slots) - 1, -1, -1):
        backward[position] = {rest + c for rest in backward[position + 1] for c in counts[position]}
    flags = Flag(0)
    for position, slot in enumerate(slots):
        usable = sum(
            1
            for c in counts[position]
            if any(target - before - c in backward[position + 1] for before in forward[position])
        )
        if usable > 1:
            flags |= slot.flag
    return flags


def _ids(variant: Variant, choice: list[int]) -> list[int]:
    ids: list[int] = []
    picks = iter(choice)
    for item in variant.items:
        if isinstance(item, Slot):
            option = item.options[next(picks)]
            ids += option.piece.ids_for(option.edit)
        else:
            ids.append(item)
    return ids
