"""What one failed attempt means for the run, read from its HTTP status **and** OpenRouter's error metadata.

The status alone misleads: OpenRouter answers 402 both for "your running requests' reserved cost fills
the in-flight budget, retry in a moment" and for "you are out of credit", and 403 both for a moderation
block (this prompt, for good) and for a spent key, workspace or guardrail budget (every prompt, until
someone raises it). Treating the second kind of 403 as a per-prompt failure would close a whole set as
"done" without its prompts; treating the first kind of 402 as a stop would make every rerun stop again.

Actions:
- `retry`: transient; back off (honouring Retry-After) and try again, up to `generation.max_attempts`;
- `throttle`: like retry, and the attempt counts as a rate-limit signal, so sustained ones lower the live
  concurrency (fewer requests in flight, fewer dollars reserved);
- `stop`: admit nothing new, let what is in flight finish, end the set resumable with `ended_because`;
- `fail`: this prompt failed for good (recorded with the server's message); `attempts` bounds how many
  tries it gets first (provider 400s can be a provider's passing fault).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from eaglepipe.openrouter.replies import RequestFailed

IN_FLIGHT_BUDGET = "openrouter_in_flight_budget"
_UNTIL_RESET = "(or wait until it resets), then rerun"
BUDGET_LIMITS = {
    "openrouter_key_limit": ("key_limit", f"raise the key's limit {_UNTIL_RESET}"),
    "openrouter_workspace_budget": ("budget_limit", f"raise the workspace budget {_UNTIL_RESET}"),
    "openrouter_guardrail_budget": ("budget_limit", f"raise the guardrail's budget {_UNTIL_RESET}"),
}
# A provider's own 400 ("Provider returned error", metadata.provider_name) may pass: a few tries, then final.
PROVIDER_ERROR_ATTEMPTS = 3


@dataclass(frozen=True)
class Verdict:
    action: Literal["retry", "throttle", "stop", "fail"]
    ended_because: str = ""
    advice: str = ""
    attempts: int | None = None


RETRY = Verdict("retry")
THROTTLE = Verdict("throttle")
FAIL = Verdict("fail")


def verdict(failure: RequestFailed) -> Verdict:
    status, source = failure.status, failure.limit_source
    if status is None or status >= 500 or status == 408:
        return RETRY
    if status == 429 or (status == 402 and source == IN_FLIGHT_BUDGET):
        return THROTTLE
    if status == 402 and _exceeds_budget_alone(failure):
        return Verdict(
            "stop",
            "request_too_dear",
            "one request's reservation (prompt + generation.max_tokens at the endpoint's price) exceeds what "
            "the account may have in flight: lower generation.max_tokens or add credits, then rerun",
        )
    if status == 402:
        return Verdict("stop", "credit_exhausted", "add credits or raise the key's limit, then rerun")
    if status == 403 and source in BUDGET_LIMITS:
        reason, advice = BUDGET_LIMITS[source]
        return Verdict("stop", reason, advice)
    if status == 401:
        return Verdict("stop", "unauthorized", "check the API key file, then rerun")
    if status == 404:
        return Verdict(
            "stop", "no_endpoint", "check model and base_url, or relax `routing` and refresh providers.json"
        )
    if status == 400 and failure.provider_name:
        return Verdict("fail", attempts=PROVIDER_ERROR_ATTEMPTS)
    return FAIL


def _exceeds_budget_alone(failure: RequestFailed) -> bool:
    """OpenRouter's `weight_exceeds_budget`: retrying the same request can never fit."""
    detail = failure.detail.lower()
    return failure.code == "weight_exceeds_budget" or "fewer max_tokens" in detail
