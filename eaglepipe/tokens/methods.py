"""How each sample's completion ids were obtained (`method`) and what is uncertain about them (`flags`).

Only ids that came from the server are called exact. Ids rebuilt from text are the canonical encoding of
the text, which is what the model generated unless it split some text differently from BPE (models do,
now and then, and often when they sample at temperature 1.0); such a split changes the token count in most
cases, so the billed count catches it, but not always. Hence `rebuilt_count_matched` promises a count, not
ids. A reply whose count misses the bill while nothing in it could have changed its structure (no reading
in doubt, no special token's text, no cut tool call) can only be split differently:
`rebuilt_segmentation_only`, whose canonical ids are the model's text, and are trained on.
"""

from __future__ import annotations

from enum import IntEnum, IntFlag


class Method(IntEnum):
    SERVER_IDS = 0  # the server's token ids, checked against the returned text
    LOGPROB_BYTES = 1  # each token's bytes from logprobs, mapped to its id, checked against the text
    REBUILT_COUNT_MATCHED = 2  # rebuilt from text: exactly one candidate reading has the billed length
    REBUILT_AMBIGUOUS = 3  # rebuilt: several readings have the billed length (or none can be checked)
    REBUILT_OFF_BY_K = 4  # rebuilt: no reading has the billed length, and its structure is in doubt
    # Rebuilt: no reading has the billed length, but only the text's split into tokens can differ (the
    # structure has one reading): the canonical ids of the model's own text; `billed_diff` as above.
    REBUILT_SEGMENTATION_ONLY = 5


EXACT_METHODS = frozenset({Method.SERVER_IDS, Method.LOGPROB_BYTES})


class Flag(IntFlag):
    """Per-sample bits; the ambiguity bits say which part of a rebuilt completion has several readings."""

    PROMPT_COUNT_MISMATCH = 1  # the rendered prompt's length differs from the billed prompt_tokens
    WHITESPACE = 2  # whitespace next to a special token (padded, stripped or as returned)
    ARGUMENTS = 4  # whitespace around tool-call arguments an engine may have trimmed
    TOOL_ID = 8  # a tool-call id an engine may have renumbered or rewritten
    STRUCTURE = 16  # whether a marker (`</think>`, the tool-section end) was generated
    REPLACEMENT_CHARACTER = 32  # the text holds U+FFFD: the bytes it replaced are unknown
    NO_BILLED_COUNT = 64  # the response carried no completion_tokens to check against
    SERVER_IDS_REJECTED = 128  # the server's ids (or logprob bytes) did not match its text
    TRUNCATED = 256  # finish_reason was length: no stop token
    PROMPT_OTHER_TOOL_FORMAT = 512  # only the other tool-declaration format matched the billed prompt
    PROMPT_SERVER_IDS_MISMATCH = 1024  # the server's prompt ids differ from our rendering; theirs are used


AMBIGUITY_FLAGS = (
    Flag.WHITESPACE
    | Flag.ARGUMENTS
    | Flag.TOOL_ID
    | Flag.STRUCTURE
    | Flag.REPLACEMENT_CHARACTER
    | Flag.NO_BILLED_COUNT
)


def flag_names(flags: int) -> list[str]:
    return [name.lower() for name, flag in Flag.__members__.items() if flags & flag]
