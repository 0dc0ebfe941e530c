"""The one exception this stage raises on bad input or a failed run, and how server errors are quoted."""

from __future__ import annotations

from typing import TYPE_CHECKING

from eaglepipe.errors import EaglepipeError

if TYPE_CHECKING:  # the spend plan imports this module while Snakemake parses: keep httpx out of it
    import httpx

MAX_DETAIL_CHARS = 200


class OpenRouterError(EaglepipeError):
    """A problem the user can fix: the message is one line naming the file, key or prompt and what to do."""


def error_detail(response: httpx.Response) -> str:
    """The server's own one-line explanation, from the body only: headers may carry the key."""
    try:
        body = response.json()
    except ValueError:
        return one_line(response.text) or response.reason_phrase
    error = body.get("error") if isinstance(body, dict) else None
    if isinstance(error, dict) and error.get("message"):
        return one_line(str(error["message"]))
    return one_line(response.text) or response.reason_phrase


def one_line(text: str) -> str:
    """Server text squeezed onto one short line, so every error we raise stays one line."""
    squeezed = " ".join(text.split())
    if len(squeezed) > MAX_DETAIL_CHARS:
        return squeezed[: MAX_DETAIL_CHARS - 3] + "..."
    return squeezed
