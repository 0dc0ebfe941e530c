"""What engines do to the whitespace next to special tokens, and the edits that undo it.

- `keep`: the text as generated (SGLang's raw output, vLLM with `spaces_between_special_tokens` off).
- `pad`: vLLM's default detokenizer joins the text runs and the kept markers (`</think>`, the tool-section
  markers) with single spaces, so reasoning ends and content starts (and ends, before a tool section) with
  a space the model never generated. Undone exactly by dropping that one space.
- `strip`: an (older) SGLang reasoning parser strips reasoning and content; whatever whitespace the model
  put at their ends is gone, so it is put back from `RESTORABLE` as candidates.
- `rstrip`: vLLM's Kimi parser strips only the end of the reasoning (before `</think>` or the tool section)
  and drops content that is only whitespace before a tool section; those are put back the same way.
"""

from __future__ import annotations

from eaglepipe.tokens.pieces import NO_EDIT, Edit

WHITESPACE_MODES = ("keep", "pad", "strip", "rstrip")
# Whitespace a stripped end may have held, most likely first (a guess: it only orders equal-length readings).
RESTORABLE = ("\n", "\n\n", " ")
_RESTORE_COSTS = {"": 0} | {w: rank + 1 for rank, w in enumerate(RESTORABLE)}


def padded(text: str, after_marker: bool, before_marker: bool) -> str:
    """A piece as a padding engine returns it. An empty piece between two markers comes back as the one
    space that joined them."""
    if not text:
        return " " if after_marker and before_marker else ""
    return (" " if after_marker else "") + text + (" " if before_marker else "")


def unpad_edit(text: str, after_marker: bool, before_marker: bool) -> Edit | None:
    """The edit that turns a padded piece back into the model's text, or None when `text` cannot have come
    from a padding engine (a space is missing, or the piece is too short to hold it)."""
    if after_marker and before_marker and text == " ":
        return Edit(drop_lead=1)
    if not text:
        return NO_EDIT
    lead, trail = int(after_marker), int(before_marker)
    if len(text) <= lead + trail or (lead and text[0] != " ") or (trail and text[-1] != " "):
        return None
    return Edit(drop_lead=lead, drop_trail=trail)


def restore_edits(text: str) -> list[tuple[Edit, int]]:
    """Every reading of a stripped piece with at most one `RESTORABLE` run put back at each end, with its
    preference cost (0: as returned). An empty piece may have been one run of whitespace."""
    if not text:
        return [(Edit(add_lead=w), cost) for w, cost in _RESTORE_COSTS.items()]
    return [
        (Edit(add_lead=lead, add_trail=trail), lead_cost + trail_cost)
        for lead, lead_cost in _RESTORE_COSTS.items()
        for trail, trail_cost in _RESTORE_COSTS.items()
    ]


def restore_trail_edits() -> list[tuple[Edit, int]]:
    """The readings of a piece that lost whitespace at its end only (vLLM's stripped reasoning)."""
    return [(Edit(add_trail=w), cost) for w, cost in _RESTORE_COSTS.items()]
