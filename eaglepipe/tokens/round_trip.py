"""The round-trip gate: every answer with server ids is also rebuilt from its text alone, exactly as an
answer without ids would be (`Rebuilder(text_only=True)`), and the two are compared.

It measures how far the text-only rebuild, the only one OpenRouter answers get, can be trusted on this
engine's text; it never changes the ids a sample trains on (the server's). A miss is either a habit of
the engine's text that the rebuild does not undo (docs/tokens.md names the known ones) or a bug.

Each miss is also told by what truly differs: `segmentation` when the rebuilt ids and the server's hold the
same special ids in the same order and decode to the same text between them (only the split into tokens
differs), `dropped_special` when the text is the same but a special id the model wrote mid-answer is
missing (the engine dropped it from its text: nothing a text-only rebuild can see), `structural`
otherwise. Set against what the text-only rebuild labelled each answer, that is the
precision of `rebuilt_segmentation_only` (every answer it keeps must truly differ only in its split) and
how much of the truly split-only the label reaches, by answer length.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from eaglepipe.target.chat_format import ChatFormat
from eaglepipe.tokens.methods import Flag
from eaglepipe.tokens.rebuild import RebuiltSample, first_difference
from eaglepipe.tokens.token_file import RoundTripMiss, RoundTripReport

# Misses listed in tokens.json; all are counted.
MISSES_LISTED = 50
# Answer lengths (the server's completion ids) the figures are split by.
LENGTH_BUCKETS = (128, 512, 2048)


def round_trip(
    chat: ChatFormat, served: list[RebuiltSample], text_only: list[RebuiltSample] | None
) -> RoundTripReport:
    """`tokens.json` `round_trip`: `served` as the stage rebuilt it, `text_only` the same records read
    without their ids (None when no record had server ids)."""
    pairs = (
        [
            (sample, sample.server_completion, rebuilt)
            for sample, rebuilt in zip(served, text_only, strict=True)
            if sample.server_completion is not None
        ]
        if text_only is not None
        else []
    )
    counts = {"exact": 0, "count_matched": 0, "off": 0}
    misses: list[RoundTripMiss] = []
    buckets: dict[str, Counter[str]] = {}
    labelled: Counter[str] = Counter()  # (label, truth) of every answer
    for sample, server, rebuilt in pairs:
        position = first_difference(rebuilt.completion_ids, server)
        truth = "exact" if position is None else _truth(chat, rebuilt.completion_ids, server)
        label = rebuilt.method.name.lower()
        labelled[f"{label}: {truth}"] += 1
        bucket = buckets.setdefault(_bucket(len(server)), Counter())
        bucket.update(["answers", truth, f"labelled {label}"])
        if position is None:
            counts["exact"] += 1
            continue
        kind = "count_matched" if len(rebuilt.completion_ids) == len(server) else "off"
        counts[kind] += 1
        misses.append(
            {
                "prompt_id": sample.prompt_id,
                "provider": sample.provider,
                "kind": kind,
                "truth": truth,
                "first_difference": position,
                "server_length": len(server),
                "rebuilt_length": len(rebuilt.completion_ids),
                "rebuilt_method": label,
            }
        )
    called = {key: n for key, n in labelled.items() if key.startswith("rebuilt_segmentation_only")}
    truly = sum(n for key, n in called.items() if key.endswith(": segmentation"))
    stray = sum(n for key, n in called.items() if key.endswith(": dropped_special"))
    split_only = sum(n for key, n in labelled.items() if key.endswith(": segmentation"))
    return {
        "samples": len(pairs),
        "exact": counts["exact"],
        "count_matched": counts["count_matched"],
        "off": counts["off"],
        "exact_share": round(counts["exact"] / len(pairs), 6) if pairs else None,
        "server_ids_rejected": sum(bool(s.flags & Flag.SERVER_IDS_REJECTED) for s, _, _ in pairs),
        "labelled_vs_truth": dict(sorted(labelled.items())),
        "segmentation_only": {
            "labelled": sum(called.values()),
            "truly_segmentation": truly,
            "precision": round(truly / sum(called.values()), 6) if called else None,
            # Labelled split-only, but the engine dropped a special id the model wrote mid-answer.
            "dropped_special": stray,
            "truly_segmentation_misses": split_only,
            "recall": round(truly / split_only, 6) if split_only else None,
        },
        "by_length": {name: dict(sorted(bucket.items())) for name, bucket in sorted(buckets.items())},
        "misses": misses[:MISSES_LISTED],
    }


def _truth(chat: ChatFormat, rebuilt: Sequence[int], server: Sequence[int]) -> str:
    if only_split_differs(chat, rebuilt, server):
        return "segmentation"
    return "dropped_special" if only_specials_dropped(chat, rebuilt, server) else "structural"


def only_specials_dropped(chat: ChatFormat, ours: Sequence[int], theirs: Sequence[int]) -> bool:
    """The same text, but special ids the server generated are missing from ours: a special token the model
    wrote in the middle of its answer (a second `</think>`, say) that the engine dropped from the text it
    returned, which no text-only rebuild can see. Structural, and told apart from other structural misses
    because its cause is the model's, not the rebuild's."""
    our_specials = [part for part in _parts(chat, ours) if isinstance(part, int)]
    their_specials = [part for part in _parts(chat, theirs) if isinstance(part, int)]
    remaining = iter(their_specials)
    is_subsequence = all(any(mine == theirs for theirs in remaining) for mine in our_specials)
    return (
        is_subsequence
        and len(our_specials) < len(their_specials)
        and _text(chat, ours) == _text(chat, theirs)
    )


def _text(chat: ChatFormat, ids: Sequence[int]) -> str:
    return "".join(part for part in _parts(chat, ids) if isinstance(part, str))


def only_split_differs(chat: ChatFormat, ours: Sequence[int], theirs: Sequence[int]) -> bool:
    """Both hold the same special ids in the same order and decode to the same text between them: only
    the split of that text into tokens differs."""
    return _parts(chat, ours) == _parts(chat, theirs)


def _parts(chat: ChatFormat, ids: Sequence[int]) -> list[int | str]:
    """The ids as text runs (decoded) and special ids, in order."""
    parts: list[int | str] = []
    start = 0
    for position in [*chat.special_positions(list(ids)), len(ids)]:
        if position > start:
            parts.append(chat.tokenizer.decode(list(ids[start:position])))
        if position < len(ids):
            parts.append(ids[position])
        start = position + 1
    return parts


def _bucket(length: int) -> str:
    """`0128-0511`-style names that sort by length."""
    low = 0
    for high in LENGTH_BUCKETS:
        if length < high:
            return f"{low:05d}-{high - 1:05d}"
        low = high
    return f"{low:05d}+"

