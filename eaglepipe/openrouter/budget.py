"""How many tokens (and dollars) the requests in flight will still bring, so admissions stop in time.

Answers are heavy-tailed, and the answers seen so far are biased short: the long ones are exactly those
still in flight. So the length distribution is estimated with Kaplan-Meier, counting each request in
flight as a right-censored observation at the tokens it has produced so far, estimated from its elapsed
time with the least-squares fit `latency = first-token time + tokens / rate` over finished answers. A
request in flight is then expected to end at E[X | X > tokens so far], which grows the longer it runs; a
request about to be admitted at the plain mean. Overestimating the tokens so far (a slow provider, a
request waiting out a back-off) errs on the safe side: it makes admissions wait, never overshoot. Mass the
finished answers do not reach is put at `max_tokens`, the cap. Admission keeps the expected total plus
`SAFETY_SIGMAS` standard deviations of what is in flight under the budget, so near the end fewer requests
are let in at once. Dollars follow tokens at the observed dollars per completion token.

Until `MIN_OBSERVATIONS` answers have finished, every request counts as the stated upper bound
(`max_tokens`, or the dearest kept endpoint's price at `max_tokens`), so an early burst of admissions
cannot overrun a small budget. The forecast is recomputed at most every `REFIT_EVERY_S` while admissions
are being decided; in between, an admission adds the mean and a finished request takes back its forecast.
"""

from __future__ import annotations

import bisect
import math
import time
from dataclasses import dataclass

MIN_OBSERVATIONS = 20
REFIT_EVERY_S = 0.25
# Admissions keep the forecast this many standard deviations (of the sum in flight) under the budget: the
# taper near the end of a budget. 2 let heavy-tailed test runs pass a token budget by 2-4% (the fit runs
# about 10% short on requests in flight); 3 kept them under it.
SAFETY_SIGMAS = 3.0


@dataclass
class _Flight:
    started: float
    tokens: float
    variance: float


@dataclass(frozen=True)
class _Conditional:
    mean: float
    variance: float


class Forecast:
    def __init__(self, max_tokens: int, upper_bound_usd: float) -> None:
        self.max_tokens = max_tokens
        self.upper_bound_usd = upper_bound_usd
        self.lengths: list[int] = []
        self.timings: list[tuple[int, float]] = []
        self.total_tokens = 0
        self.total_usd = 0.0
        self.flights: dict[str, _Flight] = {}
        self.in_flight_tokens = 0.0
        self.in_flight_variance = 0.0
        self._values: list[float] = []
        self._suffix: list[tuple[float, float, float]] = [(0.0, 0.0, 0.0)]  # mass, sum v, sum v^2 from i on
        self._fresh = _Conditional(float(max_tokens), 0.0)
        self._fitted_at = float("-inf")

    # --- observations ----------------------------------------------------------------------------

    def observe(self, tokens: int, usd: float, seconds: float | None) -> None:
        self.lengths.append(tokens)
        self.total_tokens += tokens
        self.total_usd += usd
        if seconds and seconds > 0:
            self.timings.append((tokens, seconds))

    @property
    def known(self) -> bool:
        return len(self.lengths) >= MIN_OBSERVATIONS and self.total_tokens > 0

    # --- requests in flight ----------------------------------------------------------------------

    def admit(self, key: str) -> None:
        fresh = self._fresh
        self.flights[key] = _Flight(time.monotonic(), fresh.mean, fresh.variance)
        self.in_flight_tokens += fresh.mean
        self.in_flight_variance += fresh.variance

    def finish(self, key: str) -> None:
        flight = self.flights.pop(key, None)
        if flight is not None:
            self.in_flight_tokens -= flight.tokens
            self.in_flight_variance -= flight.variance

    def refresh(self, max_age_s: float = 0.0) -> None:
        """Re-fit the length distribution with the requests in flight censored, and re-forecast them;
        skipped while the last fit is younger than `max_age_s`."""
        now = time.monotonic()
        if now - self._fitted_at < max_age_s:
            return
        self._fitted_at = now
        bounds = dict.fromkeys(self.flights, 0.0)
        if self.known:
            first_token_s, seconds_per_token = _timing_fit(self.timings)
            if seconds_per_token > 0:
                bounds = {
                    key: min(max(now - f.started - first_token_s, 0.0) / seconds_per_token, self.max_tokens)
                    for key, f in self.flights.items()
                }
            self._fit(list(bounds.values()))
        tokens = variance = 0.0
        for key, flight in self.flights.items():
            conditional = self.beyond(bounds[key])
            flight.tokens, flight.variance = conditional.mean, conditional.variance
            tokens += conditional.mean
            variance += conditional.variance
        self.in_flight_tokens, self.in_flight_variance = tokens, variance

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
        return self.upper_bound_usd * len(self.flights) if rate is None else self.in_flight_tokens * rate

    def committed_tokens(self) -> float:
        """What the requests in flight and one more admission may produce: their expected tokens plus
        SAFETY_SIGMAS standard deviations of that sum."""
        spread = math.sqrt(max(self.in_flight_variance + self._fresh.variance, 0.0))
        return self.in_flight_tokens + self._fresh.mean + SAFETY_SIGMAS * spread

    def committed_usd(self) -> float:
        rate = self.usd_per_token
        if rate is None:
            return self.upper_bound_usd * (len(self.flights) + 1)
        return self.committed_tokens() * rate

    def beyond(self, lower_bound: float) -> _Conditional:
        """X given X > lower_bound under the fitted distribution (the upper bound before any fit)."""
        if not self._values:
            return _Conditional(float(self.max_tokens), 0.0)
        mass, first, second = self._suffix[bisect.bisect_right(self._values, lower_bound)]
        if mass <= 0:
            return _Conditional(max(lower_bound, float(self.max_tokens)), 0.0)
        mean = first / mass
        return _Conditional(max(lower_bound, mean), max(second / mass - mean * mean, 0.0))

    def _fit(self, censored: list[float]) -> None:
        """Kaplan-Meier over finished lengths (events) and the in-flight bounds (censored); the mass left
        after the last event goes to max_tokens."""
        points = sorted([(float(v), True) for v in self.lengths] + [(c, False) for c in censored])
        at_risk, survival = len(points), 1.0
        values: list[float] = []
        masses: list[float] = []
        index = 0
        while index < len(points):
            value, events, leaving = points[index][0], 0, 0
            while index < len(points) and points[index][0] == value:
                events += points[index][1]
                leaving += 1
                index += 1
            if events:
                drop = survival * events / at_risk
                values.append(value)
                masses.append(drop)
                survival -= drop
            at_risk -= leaving
        if survival > 1e-12:
            if values and values[-1] == self.max_tokens:
                masses[-1] += survival
            else:
                values.append(float(self.max_tokens))
                masses.append(survival)
        suffix = [(0.0, 0.0, 0.0)] * (len(values) + 1)
        for position in range(len(values) - 1, -1, -1):
            mass, first, second = suffix[position + 1]
            weight, value = masses[position], values[position]
            suffix[position] = (mass + weight, first + weight * value, second + weight * value * value)
        self._values, self._suffix = values, suffix
        self._fresh = self.beyond(float("-inf"))


def _timing_fit(timings: list[tuple[int, float]]) -> tuple[float, float]:
    """(first-token seconds, seconds per token) by least squares; (0, 0) when lengths do not vary."""
    if len(timings) < 2:
        return 0.0, 0.0
    mean_tokens = sum(t for t, _ in timings) / len(timings)
    mean_seconds = sum(s for _, s in timings) / len(timings)
    variance = sum((t - mean_tokens) ** 2 for t, _ in timings)
    if variance <= 0:
        return 0.0, 0.0
    slope = sum((t - mean_tokens) * (s - mean_seconds) for t, s in timings) / variance
    if slope <= 0:
        return 0.0, 0.0
    return max(mean_seconds - slope * mean_tokens, 0.0), slope
