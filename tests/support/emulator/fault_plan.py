"""The tests' fault plans (`--faults FILE`, or `POST /api/v1/emulator/faults` live): the ways OpenRouter and
its providers fail, on demand, through the server's hook (eaglepipe/emulator/faults.py; fault_source.py
plugs a plan in, injected.py holds the answers a rule asks for).

A client's retry, backoff and bookkeeping code only runs when something goes wrong, so the emulator
can be told to go wrong: a YAML or JSON list of rules, each `{fault: KIND, ...}`. KIND is a generic kind
below or any named shape of `shapes.py` (every row of the failure taxonomy). Each request gets at most one
fault. A `burst` rule hits every request inside its time window (its `status`, or its named `shape`); a
rule with `times` and no `probability` hits the next `times` requests it applies to; otherwise one draw
from a generator seeded by `--fault-seed` picks the rule, each with its own `probability` (they must total
at most 1 per route), so a run with the same seed and request order meets the same faults. `times` also
caps a drawn rule. A chat rule may be scoped: `provider` (only requests routed to that provider's
endpoints, by display name) and `after_s` (only once the plan is that old).

A `status` or `burst` rule may name the `route` it hits: `chat` (the default, `/chat/completions`),
`generation` (`/generation` and `/generation/content`) or `key` (`/key`): OpenRouter's accounting routes
answer 429 and 5xx too. The other kinds shape an answer, so they hit only `chat`.
"""

from __future__ import annotations

import random
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from eaglepipe.emulator.errors import ApiError, EmulatorError
from support.emulator import shapes

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

# What a `status` or `burst` rule may say besides its status, as OpenRouter does: `code` goes to
# `metadata.reason` (e.g. capacity_exhausted), `body_code` replaces the numeric `code` (OpenRouter sometimes
# sends a string), `limit_source` marks budget limits (402 openrouter_in_flight_budget, 403
# openrouter_key_limit, ...), `provider_name` and `raw` make a provider's own error ("Provider returned
# error").
_ERROR_DETAILS = ("retry_after_s", "code", "body_code", "limit_source", "provider_name", "raw", "route")
ROUTES = ("chat", "generation", "key")
_SCOPES = frozenset({"times", "provider", "after_s"})

# kind: (required keys, optional keys), beside `fault` itself
KINDS: dict[str, tuple[frozenset[str], frozenset[str]]] = {
    "status": (frozenset({"status", "probability"}), frozenset(_ERROR_DETAILS)),
    "burst": (frozenset({"every_s", "duration_s"}), frozenset({*_ERROR_DETAILS, "status", "shape"})),
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
    # Every named shape of the taxonomy: one of probability and times, and where it applies.
    **{name: (frozenset(), frozenset({"probability", "after_tokens"})) for name in shapes.NAMES},
}
_ANSWER_KINDS = frozenset(KINDS) - {"status", "burst"}

_EXAMPLES = {
    "code": "capacity_exhausted",
    "body_code": "'402'",
    "limit_source": "openrouter_key_limit",
    "provider_name": "Chutes",
    "raw": "an upstream error text",
}


class FaultPlan:
    """Decides, request by request, which fault (if any) to inject; its clock starts when it is made."""

    def __init__(self, rules: Sequence[FaultRule] = (), seed: int = 0) -> None:
        self.rules = list(rules)
        self.bursts = [rule for rule in rules if rule.kind == "burst"]
        drawn = [rule for rule in rules if rule.kind != "burst"]
        self.counted = [rule for rule in drawn if rule.times and not rule.probability]
        self.chances = [rule for rule in drawn if rule.probability]
        self.rng = random.Random(seed)
        self.used: Counter[int] = Counter()
        self.started = time.monotonic()

    def draw(self, route: str = "chat", provider: str | None = None) -> FaultRule:
        """The fault for the next request to `route` served by `provider` (NO_FAULT for none). A route
        without rules draws nothing, so the chat faults' sequence stays as it was."""
        elapsed_s = time.monotonic() - self.started
        for rule in self.bursts:
            in_burst = elapsed_s % rule.every_s < rule.duration_s
            if rule.route == route and in_burst and self._applies(rule, elapsed_s, provider):
                return rule
        for rule in self.counted:
            if rule.route == route and self._applies(rule, elapsed_s, provider):
                return self._use(rule)
        chances = [rule for rule in self.chances if rule.route == route]
        if not chances:
            return NO_FAULT
        point = self.rng.random()
        for rule in chances:
            if point < rule.probability:
                return self._use(rule) if self._applies(rule, elapsed_s, provider) else NO_FAULT
            point -= rule.probability
        return NO_FAULT

    def _applies(self, rule: FaultRule, elapsed_s: float, provider: str | None) -> bool:
        return (
            elapsed_s >= rule.after_s
            and (rule.provider is None or (provider or "").lower() == rule.provider.lower())
            and (rule.times is None or self.used[id(rule)] < rule.times)
        )

    def _use(self, rule: FaultRule) -> FaultRule:
        self.used[id(rule)] += 1
        return rule


# key: (lowest, highest or None, integer only)
_LIMITS: dict[str, tuple[float, float | None, bool]] = {
    "probability": (0, 1, False),
    "status": (400, 599, True),
    "retry_after_s": (0, None, False),
    "every_s": (1e-3, None, False),
    "duration_s": (1e-3, None, False),
    "seconds": (0, None, False),
    "after_tokens": (1, None, True),
    "times": (1, None, True),
    "after_s": (0, None, False),
}


def _value(key: str, value: Any, where: str) -> Any:
    if key == "route":
        if value in ROUTES:
            return value
        raise EmulatorError(f"{where}: route must be one of {', '.join(ROUTES)}, got {value!r}")
    if key == "shape":
        if value in shapes.ERRORS:
            return value
        raise EmulatorError(f"{where}: shape must be an error shape of shapes.py, got {value!r}")
    if key in ("code", "body_code", "limit_source", "provider_name", "raw", "provider"):
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
    scopes = _SCOPES if kind in _ANSWER_KINDS or kind == "burst" else frozenset()
    unknown = sorted(set(entry) - required - optional - scopes - {"fault"})
    if unknown:
        allowed = ", ".join(sorted(required | optional | scopes))
        raise EmulatorError(f"{where}: unknown key {unknown[0]!r} for a {kind} rule (allowed: {allowed})")
    missing = sorted(required - set(entry))
    if missing:
        raise EmulatorError(f"{where}: a {kind} rule needs {missing[0]!r}")
    values = {key: _value(key, value, where) for key, value in entry.items() if key != "fault"}
    if kind in shapes.ALIASES:  # a name an older generic kind answers: that kind, with its settings
        alias = dict(shapes.ALIASES[kind])
        kind = alias.pop("fault")
        values = {**alias, **values, "shape": None}
    elif kind in shapes.NAMES:
        values["shape"] = kind
        if "probability" not in values and "times" not in values:
            raise EmulatorError(f"{where}: a {kind} rule needs 'probability' or 'times'")
    rule = FaultRule(kind, **values)
    if kind == "burst" and (rule.shape is None) == (entry.get("status") is None):
        raise EmulatorError(f"{where}: a burst rule needs one of 'status' and 'shape'")
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
    return fault_plan(entries, seed, str(path))


def fault_plan(entries: Any, seed: int, where: str) -> FaultPlan:
    """The checked plan from a list of rules (a file's, or a live `POST /emulator/faults` body's)."""
    path = where
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
