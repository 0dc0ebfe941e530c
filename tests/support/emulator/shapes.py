"""The failure shapes OpenRouter and its providers are documented or reported to answer with, one per name.

Each name is also a fault kind (`{fault: provider_rate_limited, probability: 0.05}`), so a rehearsal can
meet any of them on demand; `docs/generation.md` ("Failure taxonomy") lists them with the documentation
page or public bug report each was taken from. Three kinds:

- `ErrorShape`: an error body in OpenRouter's envelope `{"error": {"code", "message", "metadata"}}`, sent
  as the HTTP status (`where="http"`, with its headers), or with HTTP 200 inside the body (`"body"`: a
  top-level `error` and no choices; `"choice"`: `choices[0].error` with `finish_reason: "error"`), or as
  a stream event after some tokens (`"chunk"`, or `"chunk_no_choices"`: an error chunk whose `choices`
  is empty). `html` sends a web page instead of JSON (Cloudflare's).
- `QUIRKS`: an answer that is whole but odd (finish reasons, trailing chunks, a cut stream).
- the older generic kinds of the fault plans (fault_plan.py: `reset`,
  `stall`, `wrong_provider`, `no_usage`, ...), which some names reuse (`ALIASES`).
"""

from __future__ import annotations

import datetime
import email.utils
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

# Headers given `now` (epoch seconds) and the served provider's name; bodies' metadata the same way.
Headers = Callable[[float], dict[str, str]]
Where = Literal["http", "body", "choice", "chunk", "chunk_no_choices"]


def _reset_in(seconds: float, limit: int = 60) -> Headers:
    """OpenRouter's platform limit headers: the reset in epoch milliseconds, nothing left."""
    return lambda now: {
        "X-RateLimit-Limit": str(limit),
        "X-RateLimit-Remaining": "0",
        "X-RateLimit-Reset": str(int((now + seconds) * 1000)),
    }


def _next_midnight_ms(now: float) -> str:
    today = datetime.datetime.fromtimestamp(now, datetime.UTC).date()
    midnight = datetime.datetime.combine(today + datetime.timedelta(days=1), datetime.time(), datetime.UTC)
    return str(int(midnight.timestamp() * 1000))


def _retry_after(seconds: float) -> Headers:
    return lambda now: {"Retry-After": str(int(seconds))}


def _retry_after_date(seconds: float) -> Headers:
    return lambda now: {"Retry-After": email.utils.formatdate(now + seconds, usegmt=True)}


@dataclass(frozen=True)
class ErrorShape:
    status: int
    message: str
    metadata: Callable[[float, str], dict[str, Any]] = lambda now, provider: {}
    headers: Headers = lambda now: {}
    where: Where = "http"
    code: int | str | None = None  # error.code when it is not the status (a string, or nothing at all)
    omit_code: bool = False
    availability: dict[str, Any] | None = None
    html: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)  # beside `error` in the body (`user_id`)
    # A rate-limit window: once sent, every request (`"account"`) or every request routed to the same
    # provider (`"provider"`) gets the same answer, with the same reset, until `window_s` have passed.
    window_s: float | None = None
    window_scope: Literal["account", "provider"] = "account"

    def error(self, now: float, provider: str) -> dict[str, Any]:
        error: dict[str, Any] = {"message": self.message.format(provider=provider)}
        if not self.omit_code:
            error["code"] = self.status if self.code is None else self.code
        metadata = self.metadata(now, provider)
        if metadata:
            error["metadata"] = metadata
        if self.availability is not None:
            error["availability"] = self.availability
        return error

    def body(self, now: float, provider: str) -> bytes:
        if self.html is not None:
            return self.html.encode()
        return json.dumps({"error": self.error(now, provider), **self.extra}).encode()


def _provider(raw: Any, **more: Any) -> Callable[[float, str], dict[str, Any]]:
    return lambda now, provider: {"provider_name": provider, "raw": raw, "is_byok": False, **more}


_UPSTREAM_429 = (
    "moonshotai/kimi-k2.5 is temporarily rate-limited upstream. Please retry shortly, or add your own key to "
    "accumulate your rate limits: https://openrouter.ai/settings/integrations"
)
_CLOUDFLARE_524 = (
    "<!DOCTYPE html>\n<html><head><title>openrouter.ai | 524: A timeout occurred</title></head>"
    "<body><h1>A timeout occurred</h1><p>Cloudflare Ray ID: 8f0e1d2c3b4a5968</p></body></html>"
)

ERRORS: dict[str, ErrorShape] = {
    "provider_unauthorized": ErrorShape(
        401, "Provider returned error", _provider("Invalid API key provided")
    ),
    "unauthorized": ErrorShape(401, "User not found."),
    "request_too_dear": ErrorShape(
        402,
        "This request requires more credits, or fewer max_tokens. You requested up to 16384 tokens, but can "
        "only afford 9000. To increase, visit https://openrouter.ai/settings/credits and add more credits",
        lambda now, provider: {"limit_source": "openrouter_credits", "reason": "weight_exceeds_budget"},
    ),
    "in_flight_budget": ErrorShape(
        402,
        "This request would exceed your available credits given your current in-flight requests. Retry after "
        "in-flight requests settle, or add credits.",
        lambda now, provider: {
            "reason": "in_flight_budget_exhausted",
            "limit_source": "openrouter_in_flight_budget",
        },
        _retry_after(1),
    ),
    "key_limit": ErrorShape(
        403,
        "Key limit exceeded (weekly limit). Manage it using https://openrouter.ai/settings/keys",
        lambda now, provider: {
            "limit_source": "openrouter_key_limit",
            "limit_usd": 20.0,
            "spend_usd": 20.05,
            "resets_at": "2026-12-14T00:00:00.000Z",
        },
    ),
    "key_limit_402": ErrorShape(
        402,
        "More credits are required to run this request: this key's limit is spent",
        lambda now, provider: {"limit_source": "openrouter_key_limit"},
    ),
    "credits_exhausted": ErrorShape(
        402,
        "Insufficient credits. Add more using https://openrouter.ai/settings/credits",
        lambda now, provider: {"limit_source": "openrouter_credits"},
    ),
    "workspace_budget": ErrorShape(
        403,
        "Workspace budget exceeded",
        lambda now, provider: {
            "limit_source": "openrouter_workspace_budget",
            "scope": "workspace",
            "limit_usd": 100.0,
            "spend_usd": 100.2,
            "resets_at": "2027-01-01T00:00:00.000Z",
        },
    ),
    "guardrail_budget": ErrorShape(
        403,
        "Guardrail budget exceeded",
        lambda now, provider: {
            "limit_source": "openrouter_guardrail_budget",
            "limit_usd": 50.0,
            "spend_usd": 50.1,
        },
    ),
    "region_restricted": ErrorShape(
        403,
        "This model is not available in your region",
        lambda now, provider: {"error_type": "permission_denied"},
        availability={"code": "region_restricted", "retryable": False},
    ),
    "moderation": ErrorShape(
        403,
        'moonshotai/kimi-k2.5 requires moderation on Chutes. Your input was flagged for "violence".',
        lambda now, provider: {
            "reasons": ["violence"],
            "flagged_input": "How do I ...",
            "provider_name": provider,
            "model_slug": "moonshotai/kimi-k2.5",
        },
    ),
    "guardrail_block": ErrorShape(
        403,
        "Request blocked: prompt injection patterns detected",
        lambda now, provider: {"patterns": ["ignore previous instructions"]},
    ),
    "model_not_found": ErrorShape(
        400,
        "moonshotai/kimi-k2-5 is not a valid model ID",
        availability={"code": "model_not_found", "retryable": False},
    ),
    "no_endpoint": ErrorShape(
        404,
        "No allowed providers are available for the selected model.",
        lambda now, provider: {"available_providers": ["fireworks"], "requested_providers": ["chutes/int4"]},
    ),
    "no_endpoint_data_policy": ErrorShape(
        404,
        "No endpoints found matching your data policy (Paid model training). Configure: "
        "https://openrouter.ai/settings/privacy",
        availability={"code": "privacy_restricted", "retryable": False},
    ),
    "context_too_long": ErrorShape(
        400,
        "This endpoint's maximum context length is 262144 tokens. However, you requested about 270000 tokens "
        "(253616 of text input, 16384 in the output). Please reduce the length of either one, or use the "
        '"middle-out" transform to compress your prompt automatically.',
        lambda now, provider: {"provider_name": provider},
    ),
    "provider_refused": ErrorShape(
        400,
        "Provider returned error",
        _provider(json.dumps({"error": {"type": "invalid_request_error", "message": "tools unsupported"}})),
    ),
    "bad_request": ErrorShape(
        400,
        "thinking is enabled but reasoning_content is missing in assistant tool call message at index 2",
        lambda now, provider: {"error_type": "invalid_request"},
    ),
    "payload_too_large": ErrorShape(413, "Request payload too large"),
    "unprocessable": ErrorShape(
        422, "Unprocessable entity", lambda now, provider: {"error_type": "unprocessable"}
    ),
    "precondition_failed": ErrorShape(
        412, "Precondition failed", lambda now, provider: {"error_type": "precondition_failed"}
    ),
    "daily_rate_limit": ErrorShape(
        429,
        "Rate limit exceeded: free-models-per-day. Add 10 credits to unlock 1000 free model requests per day",
        lambda now, provider: {
            "headers": {
                "X-RateLimit-Limit": "50",
                "X-RateLimit-Remaining": "0",
                "X-RateLimit-Reset": _next_midnight_ms(now),
            },
            "provider_name": None,
            "limit_source": "openrouter_free_tier_daily",
        },
    ),
    "provider_out_of_balance": ErrorShape(
        429, "Provider returned error", _provider("insufficient balance: please recharge your account")
    ),
    "provider_rate_limited": ErrorShape(
        429,
        "Provider returned error",
        _provider(
            _UPSTREAM_429,
            limit_source="upstream_provider_shared_pool",
            remedy_hint="Retry shortly, add your own provider key, or route to another provider",
        ),
        extra={"user_id": "user_2abc"},
    ),
    "provider_rate_limited_hint": ErrorShape(
        429,
        "Provider returned error",
        _provider(
            _UPSTREAM_429, retry_after_seconds=2, retry_after_seconds_raw=1.6, headers={"Retry-After": "2"}
        ),
    ),
    "provider_rate_limited_window": ErrorShape(
        429,
        "Provider returned error",
        lambda now, provider: {
            "provider_name": provider,
            "raw": _UPSTREAM_429,
            "headers": {
                "x-ratelimit-limit-requests": "500",
                "x-ratelimit-remaining-requests": "0",
                "x-ratelimit-reset-requests": "1s",
            },
        },
        window_s=1.0,
        window_scope="provider",
    ),
    "account_rate_limited": ErrorShape(
        429,
        "Rate limit exceeded: limit_rpm/moonshotai/kimi-k2.5",
        lambda now, provider: {"error_type": "rate_limit_exceeded"},
        _reset_in(1),
        window_s=1.0,
    ),
    "account_rate_limited_in_metadata": ErrorShape(
        429,
        "Rate limit exceeded: limit_rpm/moonshotai/kimi-k2.5",
        lambda now, provider: {"headers": _reset_in(1)(now), "provider_name": None},
        window_s=1.0,
    ),
    "capacity_exhausted": ErrorShape(
        429,
        "All providers for moonshotai/kimi-k2.5 are at capacity. Retry after 1 seconds.",
        lambda now, provider: {
            "previous_errors": [{"provider": provider, "code": "capacity_exhausted", "status": 429}]
        },
        _retry_after(1),
        availability={"code": "capacity_exhausted", "retryable": True, "retry_after": 1},
    ),
    "rate_limited": ErrorShape(
        429,
        "Rate limit exceeded",
        lambda now, provider: {"error_type": "rate_limit_exceeded", "provider_code": "rate_limited"},
        _retry_after_date(1),
    ),
    "rate_limited_html": ErrorShape(429, "", html="<html><body>Too many requests (Cloudflare)</body></html>"),
    "overloaded": ErrorShape(529, "Provider returned error"),
    "request_timeout": ErrorShape(408, "Operation timed out. Please try again later."),
    "edge_error": ErrorShape(524, "", html=_CLOUDFLARE_524),
    "provider_server_error": ErrorShape(
        502,
        "Upstream error from {provider}: Unexpected token 173781 while expecting start token 200006",
        lambda now, provider: {
            "provider_name": provider,
            "raw": {"object": "error", "type": "BadRequestError", "code": 400},
        },
    ),
    "unavailable": ErrorShape(
        503,
        "Service temporarily unavailable",
        lambda now, provider: {"error_type": "provider_overloaded"},
        _retry_after(1),
        availability={"code": "temporarily_unavailable", "retryable": True, "retry_after": 1},
    ),
    "gateway_timeout": ErrorShape(524, "Request timed out. Please try again later."),
    "server_error": ErrorShape(500, "Internal Server Error", lambda now, provider: {"error_type": "server"}),
    "redirected": ErrorShape(307, "Temporary Redirect"),
    "unknown": ErrorShape(202, "Accepted"),
    # Inside an HTTP 200.
    "error_in_body": ErrorShape(
        502,
        "Provider returned error",
        _provider("upstream connection reset"),
        where="body",
        extra={"user_id": "user_2abc"},
    ),
    "error_in_choice": ErrorShape(
        502, "Error processing stream", _provider({"retryable": True}), where="choice"
    ),
    "error_in_200_uncoded": ErrorShape(
        0, "Something went wrong", _provider(None), where="body", omit_code=True
    ),
    "midstream_server_error": ErrorShape(500, "Provider disconnected", code="server_error", where="chunk"),
    "midstream_rate_limited": ErrorShape(
        429, "Rate limit exceeded", lambda now, provider: {"error_type": "rate_limit_exceeded"}, where="chunk"
    ),
    "midstream_error_no_choices": ErrorShape(
        429, "Worker local total request limit reached (33/32)", where="chunk_no_choices"
    ),
    "midstream_upstream_error": ErrorShape(
        502,
        "Upstream error from {provider}: Unexpected token 173781 while expecting start token 200006",
        _provider({"object": "error", "type": "BadRequestError", "code": 400}),
        where="chunk",
    ),
}

# Whole but odd answers (fault_source.py shapes them through the server's hook): finish reasons,
# trailing chunks, a stream's end.
QUIRKS = {
    "finish_unnormalised": "finish_reason is the provider's own (end_turn), not OpenAI's",
    "finish_native_only": "finish_reason null, native_finish_reason stop (ai-sdk-provider#420)",
    "finish_missing": "no finish reason anywhere; the stream ends with [DONE], the body is whole",
    "usage_after_finish": "the usage chunk carries a choice with finish_reason null after the finish chunk",
    "duplicate_finish": "the finish chunk is sent twice",
    "ended_after_finish": "the stream ends after the finish chunk: no usage chunk, no [DONE]",
    "unfinished": "the stream ends cleanly after some tokens: no finish reason, no [DONE]",
    "no_output": "finish_reason stop with nothing in the message and nothing billed",
    "empty_choices": "HTTP 200 with `choices: []` and nothing billed",
    "content_filter": "finish_reason content_filter",
    "not_json": "HTTP 200 whose body is cut JSON (plain) or whose event is not JSON (streamed)",
}

# Names kept by an older generic fault kind (fault_plan.py), with the keys it needs.
ALIASES: dict[str, dict[str, Any]] = {
    "network": {"fault": "reset"},
    "network_midstream": {"fault": "cutoff", "after_tokens": 8},
    "keepalive_comments": {"fault": "stall", "seconds": 0.6},
    "timeout": {"fault": "stall", "seconds": 30.0},
    "foreign_provider": {"fault": "wrong_provider"},
    "usage_missing": {"fault": "no_usage"},
    "cost_null": {"fault": "null_cost"},
}

NAMES = (*ERRORS, *QUIRKS, *ALIASES)
