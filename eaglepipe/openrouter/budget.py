"""How much the requests in flight will still cost, so admissions stop before a budget is passed.

Answers are heavy-tailed and long ones stay in flight longest, so the requests in flight at any moment
are a length-biased sample: each is expected to produce E[X^2]/E[X] of the observed lengths (or costs),
not their mean. A request about to be admitted is a fresh draw, expected at the plain mean. Until
`MIN_OBSERVATIONS` answers are seen both estimates are the stated upper bound (max_tokens, or the dearest
kept endpoint's price at max_tokens), so an early burst of admissions cannot overrun a small budget.
"""

from __future__ import annotations

MIN_OBSERVATIONS = 20


class Estimate:
    """Running first and second moments of one quantity (completion tokens, or dollars) per request."""

    def __init__(self, upper_bound: float) -> None:
        self.upper_bound = upper_bound
        self.count = 0
        self.total = 0.0
        self.total_squares = 0.0

    def add(self, value: float) -> None:
        self.count += 1
        self.total += value
        self.total_squares += value * value

    @property
    def known(self) -> bool:
        return self.count >= MIN_OBSERVATIONS and self.total > 0

    @property
    def mean(self) -> float:
        return self.total / self.count if self.known else self.upper_bound

    @property
    def in_flight_mean(self) -> float:
        """The length-biased mean E[X^2]/E[X]: what one request still in flight is expected to cost."""
        return self.total_squares / self.total if self.known else self.upper_bound

    def committed(self, in_flight: int) -> float:
        """Expected cost of the requests in flight plus one more to be admitted."""
        return in_flight * self.in_flight_mean + self.mean
