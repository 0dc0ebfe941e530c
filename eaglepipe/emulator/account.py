"""The account behind the emulator's key: its limits, what it was charged, and the generations it keeps.

OpenRouter answers from the account as well as from the model: a spent credit answers 402, a spent key
limit 403, the in-flight budget holds each running request's worst case; `/key` reports the usage,
`/generation` a finished answer's record (once a delay has passed, as on OpenRouter) and
`/generation/content` its text where the account stores it. The HTTP side (app.py) asks this module; all
of it lives on the event loop's thread, as do the server's `Traffic` counters beside it.
"""

from __future__ import annotations

import hmac
import math
import time
from collections import Counter, OrderedDict
from dataclasses import dataclass, field
from typing import Any, TypedDict

from eaglepipe.chat_api import GenerationRecord, KeyRecord
from eaglepipe.emulator.completion import Completion
from eaglepipe.emulator.errors import ApiError

KEPT_GENERATIONS = 200_000  # `/generation` answers for this many recent ids; older ones are forgotten
# What `POST /api/v1/emulator/credit` may set: its name there -> the account's field.
LIMITS = {"limit": "credit_limit", "key_limit": "key_limit", "in_flight_budget": "in_flight_budget"}


def _is_usd_limit(value: Any) -> bool:
    return value is None or (
        isinstance(value, int | float) and not isinstance(value, bool) and 0 <= value < math.inf
    )


class Limits(TypedDict):
    """`POST /emulator/credit`'s answer (the emulator's own): the limits (USD, null for none), the usage."""

    limit: float | None
    key_limit: float | None
    in_flight_budget: float | None
    usage: float


@dataclass
class Traffic:
    """What the server has been asked and how it answered (the account keeps what was charged)."""

    requests_received: int = 0
    responses_completed: int = 0
    in_flight: int = 0
    errors: Counter[int] = field(default_factory=Counter)
    faults: Counter[str] = field(default_factory=Counter)


@dataclass
class Account:
    """One key's account: who may use it, its limits, what it was charged and its generations' records."""

    api_key: str | None = None  # None: every request is let in
    credit_limit: float | None = None
    generation_delay_s: float = 0.0
    # OpenRouter's in-flight spending budget: the reserved worst case (prompt + max_tokens at the endpoint's
    # price) of the requests running now may not pass it.
    in_flight_budget: float | None = None
    # The key's own limit: spent, it answers 403 openrouter_key_limit (the account's credit answers 402).
    key_limit: float | None = None
    # The account keeps prompts and answers: `/generation/content` serves them (else 404).
    store_content: bool = False
    reserved_usd: float = 0.0
    requests_billed: int = 0
    usd_charged: float = 0.0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    # id -> (monotonic time from which `/generation` shows it, its record, its `/generation/content` data
    # or None where the account stores no content)
    generations: OrderedDict[str, tuple[float, GenerationRecord, dict[str, Any] | None]] = field(
        default_factory=OrderedDict
    )

    def authorize(self, header: str | None) -> None:
        """401 unless the `Authorization` header carries the account's key (when it has one)."""
        if self.api_key is None:
            return
        if not header:
            raise ApiError(401, "Missing Authentication header", "authentication")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(
            token.strip().encode(), self.api_key.encode()
        ):
            raise ApiError(
                401, "Invalid API key: it differs from the one this emulator requires", "authentication"
            )

    def check_credit(self) -> None:
        if self.credit_limit is not None and self.usd_charged >= self.credit_limit:
            raise ApiError(
                402,
                f"Key limit exceeded: ${self.usd_charged:.6f} used of a ${self.credit_limit:g} "
                "limit; raise the key's limit to continue",
                "payment_required",
            )

    def check_key_limit(self) -> None:
        if self.key_limit is not None and self.usd_charged >= self.key_limit:
            raise ApiError(
                403,
                "Key limit exceeded",
                "forbidden",
                limit_source="openrouter_key_limit",
                limit_usd=self.key_limit,
                spend_usd=round(self.usd_charged, 6),
                resets_at=None,
            )

    def reserve(self, usd: float, max_tokens: int) -> float:
        """Hold `usd` against the in-flight budget while the request runs; 402 when it does not fit."""
        budget = self.in_flight_budget
        if budget is not None and usd > budget:
            affordable = int(max_tokens * budget / usd)
            raise ApiError(
                402,
                "This request requires more credits, or fewer max_tokens. You requested up to "
                f"{max_tokens} tokens, but can only afford {affordable}.",
                "payment_required",
                limit_source="openrouter_credits",
                reason="weight_exceeds_budget",
            )
        if budget is not None and self.reserved_usd + usd > budget:
            raise ApiError(
                402,
                f"In-flight budget reached: ${self.reserved_usd:.4f} of ${budget:g} is reserved by requests "
                "in flight; retry after the time given",
                "payment_required",
                retry_after_s=1.0,
                limit_source="openrouter_in_flight_budget",
            )
        self.reserved_usd += usd
        return usd

    def release(self, usd: float) -> None:
        self.reserved_usd = max(0.0, self.reserved_usd - usd)

    def record(self, completion: Completion, content: dict[str, Any] | None = None) -> None:
        """Bill a finished answer (when it is billed) and keep its generation record."""
        if completion.billed:
            self.requests_billed += 1
            self.usd_charged += completion.costs()[2]
            self.prompt_tokens += completion.prompt_tokens
            self.completion_tokens += completion.completion_tokens
        visible_from = time.monotonic() + self.generation_delay_s
        self.generations[completion.id] = (visible_from, completion.generation_record(), content)
        while len(self.generations) > KEPT_GENERATIONS:
            self.generations.popitem(last=False)

    def generation(self, generation_id: str) -> GenerationRecord | None:
        """The record, once `generation_delay_s` has passed since the generation ended (as on OpenRouter)."""
        kept = self.generations.get(generation_id)
        return kept[1] if kept is not None and time.monotonic() >= kept[0] else None

    def content(self, generation_id: str) -> dict[str, Any] | None:
        """The stored prompt and answer text, visible when the record is; None where none is stored."""
        kept = self.generations.get(generation_id)
        return kept[2] if kept is not None and time.monotonic() >= kept[0] else None

    def key_data(self) -> KeyRecord:
        """`GET /key`'s data: the usage against the key's limit (the credit where it has none)."""
        used = self.usd_charged
        limit = self.key_limit if self.key_limit is not None else self.credit_limit
        return {
            "label": "emulator",
            "limit": limit,
            "limit_remaining": None if limit is None else max(0.0, limit - used),
            "limit_reset": None,
            "include_byok_in_limit": False,
            "usage": used,
            "usage_daily": used,
            "usage_weekly": used,
            "usage_monthly": used,
            "byok_usage": 0.0,
            "byok_usage_daily": 0.0,
            "byok_usage_weekly": 0.0,
            "byok_usage_monthly": 0.0,
            "is_free_tier": False,
            "is_management_key": False,
            "is_provisioning_key": False,
            "creator_user_id": None,
            "expires_at": None,
            "rate_limit": {
                "requests": -1,
                "interval": "10s",
                "note": "This field is deprecated and safe to ignore.",
            },
        }

    def set_limits(self, body: Any) -> Limits:
        """Change limits live from `{"limit"|"key_limit"|"in_flight_budget": USD or null}` (400 for
        anything else); the limits as they now are."""
        if not (
            isinstance(body, dict)
            and body
            and set(body) <= set(LIMITS)
            and all(_is_usd_limit(value) for value in body.values())
        ):
            raise ApiError(
                400,
                'send {"limit": USD} (or "key_limit", "in_flight_budget") with a non-negative number, '
                "or null for no limit",
                "invalid_request",
            )
        for name, value in body.items():
            setattr(self, LIMITS[name], None if value is None else float(value))
        return {
            "limit": self.credit_limit,
            "key_limit": self.key_limit,
            "in_flight_budget": self.in_flight_budget,
            "usage": self.usd_charged,
        }
