"""The live concurrency: sustained 429s (providers at capacity) lower it, quiet seconds raise it again.

Additive increase, multiplicative decrease, decided once per tick (a second): a tick in which at least
`CUT_MIN_429S` attempts, and at least `CUT_FRACTION` of them, were answered 429 cuts the limit by
`CUT_FACTOR`; a tick without any 429 adds `RECOVER_FRACTION` of the ceiling. A single 429 changes nothing
(the retry honours its Retry-After); a storm halves the load within two seconds and a quiet spell
restores it within twenty.
"""

from __future__ import annotations

CUT_MIN_429S = 3
CUT_FRACTION = 0.02
CUT_FACTOR = 0.7
RECOVER_FRACTION = 0.05


class AdaptiveLimit:
    """`lowest` is the lowest a cut took the limit to (the ceiling while nothing was cut): a first wave
    started small, or a ceiling shared with other jobs, is not a cut."""

    def __init__(self, ceiling: int) -> None:
        self.ceiling = ceiling
        self._limit = float(ceiling)
        self.lowest = ceiling
        self.cuts = 0
        self._attempts = 0
        self._rate_limited = 0

    @property
    def current(self) -> int:
        return max(1, int(self._limit))

    def record(self, *, rate_limited: bool) -> None:
        self._attempts += 1
        self._rate_limited += rate_limited

    def start_at(self, limit: int) -> None:
        """Begin below the ceiling (a first wave sized to what the key can reserve); ticks raise it."""
        self._limit = float(max(1, min(limit, self.ceiling)))

    def set_ceiling(self, ceiling: int) -> None:
        """The run-wide concurrency split among the jobs running now; a lower share applies at once."""
        self.ceiling = max(1, ceiling)
        self._limit = min(self._limit, self.ceiling)

    def tick(self) -> None:
        storm = self._rate_limited >= max(CUT_MIN_429S, CUT_FRACTION * self._attempts)
        if storm:
            self._limit = max(1.0, self._limit * CUT_FACTOR)
            self.cuts += 1
            self.lowest = min(self.lowest, self.current)
        elif self._rate_limited == 0:
            self._limit = min(float(self.ceiling), self._limit + max(1.0, RECOVER_FRACTION * self.ceiling))
        self._attempts = self._rate_limited = 0
