"""How many tokens (and dollars) the requests in flight will still bring, so admissions stop in time.

Answers are heavy-tailed and the finished ones biased short (the long ones are still in flight), so the
lengths are estimated with Kaplan-Meier, each request in flight right-censored at the tokens its elapsed
time says it has produced, and expected to end at E[X | X > tokens so far]; `CAP_PSEUDO_ANSWERS` at
`max_tokens` keep the tail open. Admission keeps under the budget the expected total plus margins
(`SAFETY_SIGMAS`, `FIT_ERRORS`), each request at the upper bound until `MIN_OBSERVATIONS` answers are in;
dollars follow tokens. Why these margins and refit rules, as measured (`bench/token_budget.py`,
`bench/forecast_refit.py`): docs/generation.md, "Budgets".
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np

MIN_OBSERVATIONS = 20
REFIT_EVERY_S = 0.25
REFIT_EVERY_TOKENS = 8
CAP_PSEUDO_ANSWERS = 1
# The taper's margins (docs/generation.md, "Budgets"); bench/token_budget.py measures what they give.
SAFETY_SIGMAS = 4.0
FIT_ERRORS = 2.0


@dataclass(frozen=True)
class _Conditional:
    mean: float
    variance: float
    fit_error: float  # the standard error of `mean`: the spread over the answers it rests on


class Forecast:
    def __init__(self, max_tokens: int, upper_bound_usd: float) -> None:
        self.max_tokens = max_tokens
        self.upper_bound_usd = upper_bound_usd
        self.observed = 0
        self.total_tokens = 0
        self.total_usd = 0.0
        # Answers by length, grown past the cap: the finished ones and the pseudo-answers at the cap.
        self._length_counts = np.zeros(max_tokens + 1)
        self._length_counts[max_tokens] = CAP_PSEUDO_ANSWERS
        self._timing = _TimingSums()
        self._flights = _Flights()
        self.in_flight_tokens = 0.0
        self.in_flight_variance = 0.0
        self.in_flight_fit_error = 0.0
        self._values = np.empty(0)  # the fitted distribution's support, ascending
        self._suffix = np.zeros((1, 4))  # mass, sum v, sum v^2, answers from position i on
        self._fresh = _Conditional(float(max_tokens), 0.0, 0.0)
        self._fitted_at = float("-inf")
        self._seconds_per_token = float("inf")

    # --- observations ----------------------------------------------------------------------------

    def observe(self, tokens: int, usd: float, seconds: float | None) -> None:
        length = max(int(tokens), 0)  # an index: a provider's 12.0 or -1 must not fail the run
        if length >= len(self._length_counts):
            self._length_counts = np.concatenate((self._length_counts, np.zeros(length + 1)))
        self._length_counts[length] += 1
        self.observed += 1
        self.total_tokens += tokens
        self.total_usd += usd
        if seconds and seconds > 0:
            self._timing.add(tokens, seconds)

    @property
    def known(self) -> bool:
        return self.observed >= MIN_OBSERVATIONS and self.total_tokens > 0

    # --- requests in flight ----------------------------------------------------------------------

    def admit(self, key: str) -> None:
        self.finish(key)  # a key admitted again replaces its flight
        fresh = self._fresh
        self._flights.add(key, time.monotonic(), fresh.mean, fresh.variance, fresh.fit_error)
        self.in_flight_tokens += fresh.mean
        self.in_flight_variance += fresh.variance
        self.in_flight_fit_error += fresh.fit_error

    def finish(self, key: str) -> None:
        forecast = self._flights.remove(key)
        if forecast is not None:
            tokens, variance, fit_error = forecast
            self.in_flight_tokens -= tokens
            self.in_flight_variance -= variance
            self.in_flight_fit_error -= fit_error

    @property
    def in_flight(self) -> int:
        return len(self._flights.slots)

    def refresh(self, max_age_s: float = 0.0) -> None:
        """Re-fit the length distribution with the requests in flight censored, and re-forecast them;
        skipped while the last fit is younger than `max_age_s` and than `REFIT_EVERY_TOKENS` tokens."""
        now = time.monotonic()
        if now - self._fitted_at < min(max_age_s, REFIT_EVERY_TOKENS * self._seconds_per_token):
            return
        self._fitted_at = now
        live = self._flights.live_slots()
        columns = self._flights.columns
        bounds = np.zeros(len(live))
        if self.known:
            first_token_s, seconds_per_token = self._timing.fit()
            self._seconds_per_token = seconds_per_token if seconds_per_token > 0 else float("inf")
            if seconds_per_token > 0:
                started = columns[live, _STARTED]
                bounds = np.minimum(
                    np.maximum(now - started - first_token_s, 0.0) / seconds_per_token, self.max_tokens
                )
            self._fit(bounds)
        forecasts = np.stack(self._beyond_all(bounds), axis=1)
        columns[live, _TOKENS:] = forecasts
        tokens, variance, fit_error = forecasts.sum(axis=0).tolist()
        self.in_flight_tokens, self.in_flight_variance, self.in_flight_fit_error = tokens, variance, fit_error

    # --- forecasts -------------------------------------------------------------------------------

    @property
    def mean_tokens(self) -> float:
        return self._fresh.mean

    @property
    def usd_per_token(self) -> float | None:
        return self.total_usd / self.total_tokens if self.known else None

    @property
    def mean_usd(self) -> float:
        rate = self.usd_per_token
        return self.upper_bound_usd if rate is None else self._fresh.mean * rate

    @property
    def in_flight_usd(self) -> float:
        rate = self.usd_per_token
        return self.upper_bound_usd * self.in_flight if rate is None else self.in_flight_tokens * rate

    def committed_tokens(self) -> float:
        """What the requests in flight and one more admission may produce: their expected tokens plus the
        taper's margins (module docstring)."""
        fresh = self._fresh
        spread = math.sqrt(max(self.in_flight_variance + fresh.variance, 0.0))
        fit_error = max(self.in_flight_fit_error + fresh.fit_error, 0.0)
        return self.in_flight_tokens + fresh.mean + SAFETY_SIGMAS * spread + FIT_ERRORS * fit_error

    def committed_usd(self) -> float:
        rate = self.usd_per_token
        if rate is None:
            return self.upper_bound_usd * (self.in_flight + 1)
        return self.committed_tokens() * rate

    def beyond(self, lower_bound: float) -> _Conditional:
        """X given X > lower_bound under the fitted distribution (the upper bound before any fit)."""
        means, variances, fit_errors = self._beyond_all(np.array([lower_bound]))
        return _Conditional(float(means[0]), float(variances[0]), float(fit_errors[0]))

    def _beyond_all(self, lower_bounds: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """`beyond` for many bounds at once: (means, variances, fit errors)."""
        if not len(self._values):
            nothing = np.zeros(len(lower_bounds))
            return np.full(len(lower_bounds), float(self.max_tokens)), nothing, nothing
        positions = np.searchsorted(self._values, lower_bounds, side="right")
        mass, first, second, answers = self._suffix[positions].T
        reached = mass > 0
        safe_mass = np.where(reached, mass, 1.0)
        mean = first / safe_mass
        means = np.maximum(lower_bounds, np.where(reached, mean, float(self.max_tokens)))
        variances = np.where(reached, np.maximum(second / safe_mass - mean * mean, 0.0), 0.0)
        return means, variances, np.sqrt(variances / np.maximum(answers, 1.0))

    def _fit(self, censored: np.ndarray) -> None:
        """Kaplan-Meier over finished lengths and the pseudo-answers at the cap (events) and the in-flight
        bounds (censored). At each event value v, the points at risk are those at or above v, censored
        ones included."""
        lengths = np.flatnonzero(self._length_counts)
        values, events = lengths.astype(float), self._length_counts[lengths]
        events_at_or_above = np.cumsum(events[::-1])[::-1]
        censored_at_or_above = len(censored) - np.searchsorted(np.sort(censored), values, side="left")
        at_risk = events_at_or_above + censored_at_or_above
        survival_after = np.cumprod(1.0 - events / at_risk)
        survival_before = np.concatenate(([1.0], survival_after[:-1]))
        masses = survival_before * events / at_risk
        # Only requests in flight outlive the last answer (the pseudo-answer at the cap, where their
        # bounds stop): their mass stays there.
        masses[-1] += survival_after[-1]
        moments = np.stack((masses, masses * values, masses * values * values, events), axis=1)
        suffix = np.zeros((len(values) + 1, 4))
        suffix[:-1] = np.cumsum(moments[::-1], axis=0)[::-1]
        self._values, self._suffix = values, suffix
        self._fresh = self.beyond(float("-inf"))


# `_Flights.columns`: when the request started, then its forecast (tokens, variance, fit error).
_STARTED, _TOKENS = 0, 1


class _Flights:
    """The requests in flight as rows of one array (when each started, and its forecast: tokens, variance,
    fit error), so a refit re-forecasts 2000 of them in a few numpy calls: a Python loop over them cost
    more than the rest of a plain answer's bookkeeping. A finished request's row is reused."""

    def __init__(self) -> None:
        self.slots: dict[str, int] = {}
        self.columns = np.zeros((0, 4))
        self._live = np.zeros(0, dtype=bool)
        self._free: list[int] = []

    def add(self, key: str, started: float, tokens: float, variance: float, fit_error: float) -> None:
        if not self._free:
            grown = max(64, 2 * len(self.columns))
            self._free = list(range(grown - 1, len(self.columns) - 1, -1))  # lowest first
            added = grown - len(self.columns)
            self.columns = np.concatenate((self.columns, np.zeros((added, 4))))
            self._live = np.concatenate((self._live, np.zeros(added, dtype=bool)))
        slot = self._free.pop()
        self.slots[key] = slot
        self.columns[slot] = (started, tokens, variance, fit_error)
        self._live[slot] = True

    def remove(self, key: str) -> tuple[float, float, float] | None:
        """The request's forecast (tokens, variance, fit error); None for a key not in flight."""
        slot = self.slots.pop(key, None)
        if slot is None:
            return None
        self._live[slot] = False
        self._free.append(slot)
        tokens, variance, fit_error = self.columns[slot, _TOKENS:].tolist()
        return tokens, variance, fit_error

    def live_slots(self) -> np.ndarray:
        return np.flatnonzero(self._live)


class _TimingSums:
    """Running sums for the least-squares fit `seconds = first-token seconds + tokens * seconds per
    token`, so a refit costs O(1) however many answers came before."""

    def __init__(self) -> None:
        self.count = 0
        self.tokens = self.seconds = self.tokens_squared = self.products = 0.0

    def add(self, tokens: int, seconds: float) -> None:
        self.count += 1
        self.tokens += tokens
        self.seconds += seconds
        self.tokens_squared += tokens * tokens
        self.products += tokens * seconds

    def fit(self) -> tuple[float, float]:
        """(first-token seconds, seconds per token); (0, 0) when lengths do not vary."""
        if self.count < 2:
            return 0.0, 0.0
        mean_tokens, mean_seconds = self.tokens / self.count, self.seconds / self.count
        variance = self.tokens_squared - self.count * mean_tokens * mean_tokens
        if variance <= 1e-9 * max(self.tokens_squared, 1.0):  # equal lengths, up to rounding
            return 0.0, 0.0
        slope = (self.products - self.count * mean_tokens * mean_seconds) / variance
        if slope <= 0:
            return 0.0, 0.0
        return max(mean_seconds - slope * mean_tokens, 0.0), slope
