"""How long a throttled request is told to wait, read from every place OpenRouter and its providers say it.

A 429 may carry `Retry-After` (seconds or an HTTP date), `retry-after-ms`, OpenRouter's own
`X-RateLimit-Limit/-Remaining/-Reset` (the reset in epoch milliseconds), and, for a provider's limit, that
provider's headers copied into `error.metadata.headers` (OpenAI-style `x-ratelimit-reset-requests: 6m0s`,
Anthropic-style RFC 3339 resets, or the same names as OpenRouter's). The body may add
`error.availability.retry_after`, `error.metadata.retry_after` or `error.metadata.retry_after_seconds`
(seconds). The longest wait given wins: a
window that stays closed for 30 s is not open again after a `Retry-After: 1`. A reset counts only when its
window is spent (`remaining` 0, or not said): a 429 from elsewhere does not make a window with requests
left into one to wait for.
"""

from __future__ import annotations

import datetime
import email.utils
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

# A numeric reset above these is an epoch timestamp (in ms, or in s), below them a delay in seconds.
_EPOCH_MS = 1e12
_EPOCH_S = 1e9
_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|h|m|s)")

_RETRY_AFTER = ("retry-after",)
_RETRY_AFTER_MS = ("retry-after-ms",)
_RESETS = (
    "x-ratelimit-reset",
    "x-ratelimit-reset-requests",
    "x-ratelimit-reset-tokens",
    "anthropic-ratelimit-requests-reset",
    "anthropic-ratelimit-tokens-reset",
    "anthropic-ratelimit-output-tokens-reset",
)
_REMAINING = (
    "x-ratelimit-remaining",
    "x-ratelimit-remaining-requests",
    "x-ratelimit-remaining-tokens",
    "anthropic-ratelimit-requests-remaining",
    "anthropic-ratelimit-tokens-remaining",
    "anthropic-ratelimit-output-tokens-remaining",
)


@dataclass(frozen=True)
class Wait:
    """`seconds` to wait; `source` names where it was read; `window` is True when a rate-limit window
    (not one overloaded request) said so: the account or provider takes nothing new before it resets."""

    seconds: float
    source: str
    window: bool = False


def throttle_wait(headers: Mapping[str, str], error: Any, now: float | None = None) -> Wait | None:
    """The longest wait the response's headers and its error body give, or None. `now` is the epoch
    second resets are measured from: the response's own `Date` header when given (the server's clock),
    else this machine's."""
    error = error if isinstance(error, dict) else {}
    metadata = error.get("metadata") if isinstance(error.get("metadata"), dict) else {}
    now = _server_now(headers) if now is None else now
    waits = list(_header_waits(_lowered(headers), now, ""))
    copied = metadata.get("headers")
    if isinstance(copied, dict):
        waits += _header_waits(_lowered(copied), now, "error.metadata.headers.")
    availability = error.get("availability") if isinstance(error.get("availability"), dict) else {}
    for source, value in (
        ("error.availability.retry_after", availability.get("retry_after")),
        ("error.metadata.retry_after", metadata.get("retry_after")),
        ("error.metadata.retry_after_seconds", metadata.get("retry_after_seconds")),
    ):
        seconds = _number(value)
        if seconds is not None:
            waits.append(Wait(max(0.0, seconds), source))
    return max(waits, key=lambda wait: wait.seconds, default=None)


def _header_waits(headers: dict[str, str], now: float, prefix: str) -> list[Wait]:
    waits = []
    for name in _RETRY_AFTER:
        if name in headers and (seconds := _retry_after(headers[name], now)) is not None:
            waits.append(Wait(seconds, prefix + name))
    for name in _RETRY_AFTER_MS:
        if name in headers and (milliseconds := _number(headers[name])) is not None:
            waits.append(Wait(max(0.0, milliseconds / 1000), prefix + name))
    spent = [name for name in _REMAINING if name in headers and _number(headers[name]) == 0]
    said = [name for name in _REMAINING if name in headers]
    if said and not spent:
        return waits  # the window has requests left: its reset is not what this 429 waits for
    for name in _RESETS:
        if name in headers and (seconds := _reset(headers[name], now)) is not None:
            waits.append(Wait(seconds, prefix + name, window=True))
    return waits


def _retry_after(value: str, now: float) -> float | None:
    """HTTP's Retry-After: delay-seconds or an HTTP date."""
    seconds = _number(value)
    if seconds is not None:
        return max(0.0, seconds)
    when = _http_date(value)
    return None if when is None else max(0.0, when - now)


def _reset(value: str, now: float) -> float | None:
    """A window's reset as seconds from now: epoch milliseconds (OpenRouter), epoch seconds, a delay in
    seconds, a duration (`1s`, `6m0s`, `20ms`: OpenAI's), or an RFC 3339 / HTTP date (Anthropic's)."""
    number = _number(value)
    if number is not None:
        if number > _EPOCH_MS:
            return max(0.0, number / 1000 - now)
        if number > _EPOCH_S:
            return max(0.0, number - now)
        return max(0.0, number)
    text = value.strip()
    parts = _DURATION.findall(text)
    if parts and "".join(f"{amount}{unit}" for amount, unit in parts) == text:
        scale = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
        return sum(float(amount) * scale[unit] for amount, unit in parts)
    when = _iso_date(text)
    if when is None:
        when = _http_date(text)
    return None if when is None else max(0.0, when - now)


def _server_now(headers: Mapping[str, str]) -> float:
    date = _lowered(headers).get("date")
    when = _http_date(date) if date else None
    return when if when is not None else datetime.datetime.now(datetime.UTC).timestamp()


def _http_date(value: str) -> float | None:
    try:
        return email.utils.parsedate_to_datetime(value).timestamp()
    except (TypeError, ValueError, IndexError):
        return None


def _iso_date(value: str) -> float | None:
    try:
        when = datetime.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return when.timestamp() if when.tzinfo else None


def _lowered(headers: Mapping[str, Any]) -> dict[str, str]:
    return {str(name).lower(): str(value) for name, value in headers.items()}


def _number(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    try:
        number = float(value) if isinstance(value, int | float) else float(str(value).strip())
    except ValueError:
        return None
    return number if math.isfinite(number) else None
