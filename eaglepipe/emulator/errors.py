"""The ways the emulator fails: a problem for the operator, or an API error for the client."""

from __future__ import annotations

import math
from typing import Any

from eaglepipe.chat_api import ApiErrorObject, ErrorBody
from eaglepipe.errors import EaglepipeError


class EmulatorError(EaglepipeError, RuntimeError):
    """Bad config or a server that could not start: one line saying what to fix."""


class ApiError(Exception):
    """An HTTP error in OpenRouter's body shape, so the client under test handles the real thing.

    With `retry_after_s` the answer carries a `Retry-After` header and the wait in the body too
    (`error.metadata.retry_after`, `error.availability`), the places OpenRouter's clients look.
    """

    def __init__(
        self,
        status: int,
        message: str,
        error_type: str,
        *,
        retry_after_s: float | None = None,
        code: int | str | None = None,
        **metadata: Any,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.retry_after_s = retry_after_s
        # OpenRouter's `code` is usually the status, but may be a string (a name, or the status as text).
        self.code = status if code is None else code
        self.metadata = {"error_type": error_type, **metadata}

    def body(self) -> ErrorBody:
        error: ApiErrorObject = {"code": self.code, "message": self.message, "metadata": self.metadata}
        if self.retry_after_s is not None:
            error["metadata"] = {**self.metadata, "retry_after": self.retry_after_s}
            error["availability"] = {"retry_after": self.retry_after_s, "retryable": True}
        return {"error": error}

    def headers(self) -> dict[str, str]:
        """`Retry-After` in whole seconds, rounded up: HTTP allows no fraction there."""
        if self.retry_after_s is None:
            return {}
        return {"Retry-After": str(math.ceil(self.retry_after_s))}
