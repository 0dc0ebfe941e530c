"""Injected failures (`--faults FILE`): the ways OpenRouter and its providers fail, on demand.

A client's retry, backoff and bookkeeping code only runs when something goes wrong, so the emulator
can be told to go wrong: a YAML or JSON list of rules, each `{fault: KIND, ...}`. Each request gets at
most one fault. A `burst` rule hits every request inside its time window; otherwise one draw from a
generator seeded by `--fault-seed` picks the rule, each with its own `probability` (they must total at
most 1 per route), so a run with the same seed and request order meets the same faults.

A `status` or `burst` rule may name the `route` it hits: `chat` (the default, `/chat/completions`),
`generation` (`/generation` and `/generation/content`) or `key` (`/key`): OpenRouter's accounting routes
answer 429 and 5xx too. The other kinds shape an answer, so they hit only `chat`.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from eaglepipe.emulator.errors import ApiError, EmulatorError

# What a `status` or `burst` rule may say besides its status, as OpenRouter does: `code` goes to
# `metadata.reason` (e.g. capacity_exhausted), `body_code` replaces the numeric `code` (OpenRouter sometimes
# sends a string), `limit_source` marks budget limits (402 openrouter_in_flight_budget, 403
# openrouter_key_limit, ...), `provider_name` and `raw` make a provider's own error ("Provider returned
# error").
_ERROR_DETAILS = ("retry_after_s", "code", "body_code", "limit_source", "provider_name", "raw", "route")
ROUTES = ("chat", "generation", "key")

# kind: (required keys, optional keys), beside `fault` itself
KINDS: dict[str, tuple[frozenset[str], frozenset[str]]] = {
    "status": (frozenset({"status", "probability"}), frozenset(_ERROR_DETAILS)),
    "burst": (frozenset({"status", "every_s", "duration_s"}), frozenset(_ERROR_DETAILS)),
    "error_in_200": (frozenset({"probability"}), frozenset()),
    "midstream_error": (frozenset({"probability"}), frozenset({"after_tokens"})),
    "empty_choices": (frozenset({"probability"}), frozenset()),
    "reset": (frozenset({"probability"}), frozenset()),
    "stall": (frozenset({"probability", "seconds"}), frozenset()),
    "wrong_provider": (frozenset({"probability"}), frozenset()),
    # A stream that ends without its usage chunk (a plain answer without `usage`), and usage whose `cost`
    # is null: billed all the same, priced only by `/generation`.
    "no_usage": (frozenset({"probability"}), frozenset()),
    "null_cost": (frozenset({"probability"}), frozenset()),
    # The connection breaks after `after_tokens` tokens (a plain answer: after its headers) while the
    # provider generates the whole answer and bills it: only `/generation` knows the cost.
    "cutoff": (frozenset({"probability"}), frozenset({"after_tokens"})),
}

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

    def in_burst(self, elapsed_s: float) -> bool:
        return elapsed_s % self.every_s < self.duration_s

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

_LIMIT_TEXT = {
    "openrouter_in_flight_budget": "The estimated cost of your requests in flight fills your budget",
    "openrouter_key_limit": "Key limit exceeded",
    "openrouter_workspace_budget": "Workspace budget exceeded",
    "openrouter_guardrail_budget": "Guardrail budget exceeded",
    "openrouter_credits": "Insufficient credits",
}
_EXAMPLES = {
    "code": "capacity_exhausted",
    "body_code": "'402'",
    "limit_source": "openrouter_key_limit",
    "provider_name": "Chutes",
    "raw": "an upstream error text",
}


class FaultPlan:
    """Decides, request by request, which fault (if any) to inject."""

    def __init__(self, rules: Sequence[FaultRule] = (), seed: int = 0) -> None:
        self.bursts = [rule for rule in rules if rule.kind == "burst"]
        self.chances = [rule for rule in rules if rule.kind != "burst"]
        self.rng = random.Random(seed)

    def draw(self, elapsed_s: float, route: str = "chat") -> FaultRule:
        """The fault for the next request to `route`, `elapsed_s` after the server started (NO_FAULT for
        none). A route without rules draws nothing, so the chat faults' sequence stays as it was."""
        for rule in self.bursts:
            if rule.route == route and rule.in_burst(elapsed_s):
                return rule
        chances = [rule for rule in self.chances if rule.route == route]
        if not chances:
            return NO_FAULT
        point = self.rng.random()
        for rule in chances:
            if point < rule.probability:
                return rule
            point -= rule.probability
        return NO_FAULT


# key: (lowest, highest or None, integer only)
_LIMITS: dict[str, tuple[float, float | None, bool]] = {
    "probability": (0, 1, False),
    "status": (400, 599, True),
    "retry_after_s": (0, None, False),
    "every_s": (1e-3, None, False),
    "duration_s": (1e-3, None, False),
    "seconds": (0, None, False),
    "after_tokens": (1, None, True),
}


def _value(key: str, value: Any, where: str) -> Any:
    if key == "route":
        if value in ROUTES:
            return value
        raise EmulatorError(f"{where}: route must be one of {', '.join(ROUTES)}, got {value!r}")
    if key in ("code", "body_code", "limit_source", "provider_name", "raw"):
        if isinstance(value, str) and value:
            return value
        raise EmulatorError(f"{where}: {key} must be a non-empty string such as {_EXAMPLES[key]}")
    low, high, integer = _LIMITS[key]
    if (
        isinstance(value, bool)
        or not isinstance(value, int if integer else int | float)
        or value < low
        or (high is not None and value > high)
    ):
        what = "an integer" if integer else "a number"
        limits = f"between {low:g} and {high:g}" if high is not None else f"at least {low:g}"
        raise EmulatorError(f"{where}: {key} must be {what} {limits}, got {value!r}")
    return value if integer else float(value)


def _rule(entry: Any, where: str) -> FaultRule:
    if not isinstance(entry, dict):
        raise EmulatorError(f"{where}: a rule must be an object such as {{fault: reset, probability: 0.01}}")
    kind = entry.get("fault")
    if not isinstance(kind, str) or kind not in KINDS:
        raise EmulatorError(f"{where}: unknown fault kind {kind!r} (known: {', '.join(KINDS)})")
    required, optional = KINDS[kind]
    unknown = sorted(set(entry) - required - optional - {"fault"})
    if unknown:
        allowed = ", ".join(sorted(required | optional))
        raise EmulatorError(f"{where}: unknown key {unknown[0]!r} for a {kind} rule (allowed: {allowed})")
    missing = sorted(required - set(entry))
    if missing:
        raise EmulatorError(f"{where}: a {kind} rule needs {missing[0]!r}")
    values = {key: _value(key, value, where) for key, value in entry.items() if key != "fault"}
    rule = FaultRule(kind, **values)
    if kind == "burst" and rule.duration_s > rule.every_s:
        raise EmulatorError(f"{where}: duration_s ({rule.duration_s:g}) exceeds every_s ({rule.every_s:g})")
    return rule


def load_faults(path: Path | None, seed: int = 0) -> FaultPlan:
    """The checked plan from a `--faults` file; no file injects nothing."""
    if path is None:
        return FaultPlan(seed=seed)
    try:
        entries = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise EmulatorError(f"{path}: cannot read the faults file ({exc})") from None
    if not isinstance(entries, list):
        raise EmulatorError(f"{path}: expected a list of rules such as [{{fault: reset, probability: 0.01}}]")
    rules = [_rule(entry, f"{path}: faults[{index}]") for index, entry in enumerate(entries)]
    totals = dict.fromkeys(ROUTES, 0.0)
    for index, rule in enumerate(rules):
        totals[rule.route] += rule.probability
        if totals[rule.route] > 1 + 1e-9:
            raise EmulatorError(
                f"{path}: faults[{index}]: the probabilities of route {rule.route} add up to "
                f"{totals[rule.route]:g} by this rule; a request gets at most one fault, so they must "
                "total at most 1"
            )
    return FaultPlan(rules, seed)
