"""The hook for injected failures: a `FaultSource` hands the server one `FaultRule` per request, and the
server answers as the rule says (app.py, streaming.py, injected.py). The server itself injects nothing;
the tests' fault plans (tests/support/emulator/fault_plan.py: `--faults FILE`, `POST
/api/v1/emulator/faults`) plug in here.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Protocol

from eaglepipe.emulator import shapes
from eaglepipe.emulator.errors import ApiError

# What OpenRouter says for each status (error_type, message); others get a generic line.
_STATUS_TEXT = {
    408: ("timeout", "Request timed out"),
    429: ("rate_limit", "Rate limit exceeded: the provider is at capacity"),
    400: ("invalid_request", "Bad request"),
    402: ("payment_required", "Insufficient credits"),
    403: ("forbidden", "Your request was flagged by moderation"),
    500: ("server", "Internal server error"),
    502: ("upstream", "Provider returned an invalid response"),
    503: ("unavailable", "No provider is available for this request right now"),
    524: ("timeout", "The provider timed out"),
    529: ("overloaded", "The provider is overloaded"),
}
_LIMIT_TEXT = {
    "openrouter_in_flight_budget": "The estimated cost of your requests in flight fills your budget",
    "openrouter_key_limit": "Key limit exceeded",
    "openrouter_workspace_budget": "Workspace budget exceeded",
    "openrouter_guardrail_budget": "Guardrail budget exceeded",
    "openrouter_credits": "Insufficient credits",
}


@dataclass(frozen=True)
class FaultRule:
    """One checked rule; fields a kind does not use keep their defaults."""

    kind: str
    probability: float = 0.0
    status: int = 0
    retry_after_s: float | None = None
    code: str | None = None
    body_code: str | None = None
    limit_source: str | None = None
    provider_name: str | None = None
    raw: str | None = None
    every_s: float = 0.0
    duration_s: float = 0.0
    seconds: float = 0.0
    after_tokens: int = 1
    route: str = "chat"
    # A named shape (shapes.py): the rule's own kind, or what a burst sends.
    shape: str | None = None
    times: int | None = None
    provider: str | None = None
    after_s: float = 0.0

    def api_error(self) -> ApiError:
        """The HTTP error of a `status` or `burst` rule, in OpenRouter's body."""
        error_type, text = _STATUS_TEXT.get(self.status, ("server", f"Upstream error {self.status}"))
        extra: dict[str, Any] = {} if self.code is None else {"reason": self.code}
        if self.limit_source:
            text = _LIMIT_TEXT.get(self.limit_source, f"Limit reached ({self.limit_source})")
            extra |= {"limit_source": self.limit_source, "limit_usd": 10.0, "spend_usd": 10.0}
        if self.provider_name:
            text = "Provider returned error"
            extra |= {"provider_name": self.provider_name, "raw": self.raw}
        return ApiError(
            self.status,
            f"{text} (emulator fault injection)",
            error_type,
            retry_after_s=self.retry_after_s,
            code=self.body_code,
            **extra,
        )


NO_FAULT = FaultRule("none")


class FaultSource(Protocol):
    def draw(self, route: str = "chat", provider: str | None = None) -> FaultRule:
        """The fault for the next request to `route` ("chat", "generation", "key") served by `provider`."""
        ...


class NoFaults:
    """The served default: every request answered as asked."""

    def draw(self, route: str = "chat", provider: str | None = None) -> FaultRule:
        return NO_FAULT


def shaped_error(shape: shapes.ErrorShape | None, provider: str) -> tuple[int, dict[str, Any]]:
    """(status, error object) of an error inside an HTTP 200 or a stream: the shape's as `provider` sends
    it, else a generic 502."""
    if shape is None:
        generic = ApiError(
            502, "Provider returned an error mid-answer (emulator fault injection)", "upstream"
        )
        return generic.status, generic.body()["error"]
    return shape.status, shape.error(time.time(), provider)
