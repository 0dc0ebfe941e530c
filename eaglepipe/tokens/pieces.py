"""A text piece (reasoning, content, a tool call's id or arguments) encoded once, edited at its ends cheaply.

Reconstruction tries several readings of each piece: a space dropped at an end (an engine padded it), or
whitespace put back at an end (an engine stripped it). Re-encoding a 10,000-token reasoning per reading
would cost more than the whole budget of a million tokens a second, so each piece is encoded once and an
edit at one end re-encodes only the text up to a cut that no edit can move:

- a space between two letters: no pre-token pattern of Kimi's (or GPT-2's) split continues a letter run
  over a space, and the pre-token that starts at the space depends only on what follows;
- a newline followed by a letter: newline runs end at the last newline, and letters start a new piece;
- a Han character followed by CJK punctuation: Han runs are pieces of their own.

So `encode(edit + text) == encode(edit + text[:cut]) + encode(text[cut:])`. Each cut is also checked
against the piece's own ids once (the head's ids must be a prefix of them), so a tokenizer that behaves
otherwise falls back to encoding whole edited pieces instead of giving wrong ids.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

Encode = Callable[[str], list[int]]

# Cuts are looked for this far into a piece from each end; beyond it a piece is simply re-encoded.
CUT_WINDOW = 256
# Kimi's encoder cuts its input into 400,000-character windows counted from the start, which an edit at
# the start would move: longer pieces are re-encoded whole.
MAX_CUT_TEXT = 300_000
_CUT = re.compile(
    r"(?<=[^\W\d_]) (?=[^\W\d_])"  # a space between letters
    r"|(?<=\n)(?=[^\W\d_])"  # a newline, then a letter
    r"|(?<=[\u4e00-\u9fff])(?=[\u3000-\u303f\uff00-\uffef])"  # a Han character, then CJK punctuation
)


@dataclass(frozen=True)
class Edit:
    """Drop characters at an end, then add text there:
    `add_lead + text[drop_lead : len - drop_trail] + add_trail`."""

    drop_lead: int = 0
    add_lead: str = ""
    drop_trail: int = 0
    add_trail: str = ""

    def apply(self, text: str) -> str:
        return self.add_lead + text[self.drop_lead : len(text) - self.drop_trail] + self.add_trail

    @property
    def leads(self) -> bool:
        return bool(self.drop_lead or self.add_lead)

    @property
    def trails(self) -> bool:
        return bool(self.drop_trail or self.add_trail)


NO_EDIT = Edit()


class Piece:
    """A piece of text with its ids; counts and ids of edited readings, re-encoding only near the edit."""

    def __init__(self, text: str, encode: Encode) -> None:
        self.text = text
        self.encode = encode
        self.ids = encode(text) if text else []
        # (cut, token count up to it), None: no cut, False: not looked for yet
        self._head: tuple[int, int] | None | Literal[False] = False
        self._tail: tuple[int, int] | None | Literal[False] = False
        self._counts: dict[Edit, int] = {NO_EDIT: len(self.ids)}

    def count(self, edit: Edit) -> int:
        if edit not in self._counts:
            self._counts[edit] = self._count(edit)
        return self._counts[edit]

    def ids_for(self, edit: Edit) -> list[int]:
        if edit == NO_EDIT:
            return self.ids
        cuts = self._cuts(edit)
        if cuts is None:
            return self.encode(edit.apply(self.text))
        (head_cut, head_tokens), (tail_cut, tail_tokens) = cuts
        lead = self.encode(edit.add_lead + self.text[edit.drop_lead : head_cut]) if edit.leads else []
        end = len(self.text) - edit.drop_trail
        trail = self.encode(self.text[tail_cut:end] + edit.add_trail) if edit.trails else []
        return lead + self.ids[head_tokens : len(self.ids) - tail_tokens] + trail

    def _count(self, edit: Edit) -> int:
        cuts = self._cuts(edit)
        if cuts is None:
            return len(self.encode(edit.apply(self.text)))
        (head_cut, head_tokens), (tail_cut, tail_tokens) = cuts
        total = len(self.ids) - head_tokens - tail_tokens
        if edit.leads:
            total += len(self.encode(edit.add_lead + self.text[edit.drop_lead : head_cut]))
        else:
            total += head_tokens
        if edit.trails:
            total += len(self.encode(self.text[tail_cut : len(self.text) - edit.drop_trail] + edit.add_trail))
        else:
            total += tail_tokens
        return total

    def _cuts(self, edit: Edit) -> tuple[tuple[int, int], tuple[int, int]] | None:
        """(head cut, tokens before it) and (tail cut, tokens after it) for this edit, or None where it must
        re-encode the whole piece. An end the edit leaves alone gets the piece's own end as its cut."""
        head = (0, 0)
        if edit.leads:
            found = self.head_cut()
            if found is None or found[0] <= edit.drop_lead:
                return None
            head = found
        tail = (len(self.text), 0)
        if edit.trails:
            found = self.tail_cut()
            if found is None or found[0] >= len(self.text) - edit.drop_trail:
                return None
            tail = found
        if head[0] > tail[0] or head[1] + tail[1] > len(self.ids):
            return None
        return head, tail

    def head_cut(self) -> tuple[int, int] | None:
        """The first cut in the piece's opening window, checked against the piece's ids."""
        if self._head is False:
            match = _CUT.search(self.text, 2, CUT_WINDOW)
            self._head = None
            if match and len(self.text) <= MAX_CUT_TEXT:
                head_ids = self.encode(self.text[: match.start()])
                if self.ids[: len(head_ids)] == head_ids:
                    self._head = (match.start(), len(head_ids))
        return self._head

    def tail_cut(self) -> tuple[int, int] | None:
        """The last cut in the piece's closing window, checked against the piece's ids."""
        if self._tail is False:
            last = None
            for match in _CUT.finditer(self.text, max(2, len(self.text) - CUT_WINDOW), len(self.text) - 2):
                last = match
            self._tail = None
            if last and len(self.text) <= MAX_CUT_TEXT:
                tail_ids = self.encode(self.text[last.start() :])
                if tail_ids and self.ids[len(self.ids) - len(tail_ids) :] == tail_ids:
                    self._tail = (last.start(), len(tail_ids))
        return self._tail
