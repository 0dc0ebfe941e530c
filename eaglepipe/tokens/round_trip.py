"""The round-trip gate: every answer with server ids is also rebuilt from its text alone, exactly as an
answer without ids would be (`Rebuilder(text_only=True)`), and the two are compared.

It measures how far the text-only rebuild, the only one OpenRouter answers get, can be trusted on this
engine's text; it never changes the ids a sample trains on (the server's). A miss is either a habit of
the engine's text that the rebuild does not undo (docs/tokens.md names the known ones) or a bug.
"""

from __future__ import annotations

from typing import Any

from eaglepipe.tokens.methods import Flag
from eaglepipe.tokens.rebuild import RebuiltSample, first_difference

# Misses listed in tokens.json; all are counted.
MISSES_LISTED = 50


def round_trip(served: list[RebuiltSample], text_only: list[RebuiltSample] | None) -> dict[str, Any]:
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
    misses = []
    for sample, server, rebuilt in pairs:
        position = first_difference(rebuilt.completion_ids, server)
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
                "first_difference": position,
                "server_length": len(server),
                "rebuilt_length": len(rebuilt.completion_ids),
                "rebuilt_method": rebuilt.method.name.lower(),
            }
        )
    return {
        "samples": len(pairs),
        **counts,
        "exact_share": round(counts["exact"] / len(pairs), 6) if pairs else None,
        "server_ids_rejected": sum(bool(s.flags & Flag.SERVER_IDS_REJECTED) for s, _, _ in pairs),
        "misses": misses[:MISSES_LISTED],
    }
