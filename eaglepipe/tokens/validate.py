"""Structural checks every sample passes before it is written, whatever produced its ids.

The prompt must end with the generation prompt (so the row starts with a whole rendered prompt); the
completion's special ids must be exactly the markers of a generated turn, in order, ending with the stop
token unless the reply was cut off (so no special id sits inside a text piece); every id must lie in the
vocabulary. The loss mask is built from `prompt_len`, so it covers exactly the completion.
"""

from __future__ import annotations

import re
from functools import cache

from eaglepipe.target.chat_format import ChatFormat

# Marker letters: T </think>, S/Z tool section begin/end, B call begin, A argument begin, E call end, M stop.
_STOPPED = re.compile(r"T?(?:S(?:BAE)*Z)?M")
_CUT_OFF = re.compile(r"T?(?:S(?:BAE)*(?:B|BA|Z)?)?")


@cache
def marker_text(chat: ChatFormat) -> re.Pattern[str]:
    """Any special token's own text (`<|im_end|>`, `</think>`, `<|tool_call_begin|>`), longest first."""
    distinct = {chat.tokenizer.decode([token_id]) for token_id in chat.special_ids}
    texts = sorted((t for t in distinct if t.strip()), key=len, reverse=True)
    return re.compile("|".join(map(re.escape, texts))) if texts else re.compile(r"(?!)")


def marker_text_problem(chat: ChatFormat, texts: list[str], *, excess: int | None) -> str | None:
    """A special token's text inside the returned text that a parser leaked. A model may write one as
    ordinary text (an answer about chat templates), and then the text's rebuild has about the billed length;
    a parser that leaks a marker returns its text, several tokens, for the one special id the model
    generated, so the rebuild runs over the bill by at least that many less one. `excess`: the rebuild's
    length minus the bill (None without a bill, which cannot clear the text)."""
    pattern = marker_text(chat)
    found = [match.group() for text in texts if text for match in pattern.finditer(text)]
    if not found:
        return None
    leak_excess = min(len(chat.encode(marker)) - 1 for marker in found)
    if excess is not None and excess < leak_excess:
        return None
    return f"marker_text_in_reply ({found[0]})"


@cache
def _letters(chat: ChatFormat) -> dict[int, str]:
    layout = chat.layout
    named = {
        layout.think_end: "T",
        layout.section_begin: "S",
        layout.section_end: "Z",
        layout.call_begin: "B",
        layout.argument_begin: "A",
        layout.call_end: "E",
        layout.stop: "M",
    }
    return {token_id: letter for token_id, letter in named.items() if token_id is not None}


def structure_problem(
    chat: ChatFormat, prompt: list[int], completion: list[int], *, truncated: bool, thinking: bool
) -> str | None:
    """Why the sample is malformed (a short snake_case reason), or None."""
    if not completion:
        return "empty_completion"
    vocab_size = chat.tokenizer.vocab_size
    if min(min(prompt), min(completion)) < 0 or max(max(prompt), max(completion)) >= vocab_size:
        return "id_outside_vocabulary"
    opening = chat.generation_prompt(thinking)
    if prompt[-len(opening) :] != opening:
        return "prompt_without_generation_prompt"
    if not truncated and completion[-1] != chat.layout.stop:
        return "missing_stop_token"
    markers = [completion[position] for position in chat.special_positions(completion)]
    letters = _letters(chat)
    if any(token_id not in letters for token_id in markers):
        return "special_id_inside_text"
    sequence = "".join(letters[token_id] for token_id in markers)
    if "M" in (sequence if truncated else sequence[:-1]):
        return "stop_token_inside_completion"
    if not (_CUT_OFF if truncated else _STOPPED).fullmatch(sequence) or ("T" in sequence and not thinking):
        return "markers_out_of_order"
    return None
