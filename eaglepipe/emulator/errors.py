"""The two ways the emulator fails: a problem for the operator, or an API error for the client."""

from __future__ import annotations

from typing import Any


class EmulatorError(RuntimeError):
    """Bad config or a server that could not start: one line saying what to fix."""


class ApiError(Exception):
    """An HTTP error in OpenRouter's body shape, so the client under test handles the real thing."""

    def __init__(self, status: int, message: str, error_type: str, **metadata: Any) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.metadata = {"error_type": error_type, **metadata}

    def body(self) -> dict[str, Any]:
        return {"error": {"code": self.status, "message": self.message, "metadata": self.metadata}}
