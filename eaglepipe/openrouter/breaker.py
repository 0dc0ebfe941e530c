"""Per-provider circuit breaker: stop paying a provider whose answers cannot be used.

A provider earns a strike for each answer or error that says its answers are unusable: a provider 400
(`metadata.provider_name`), an HTTP 200 that is not an answer, and an answer the token stage's structural
check refuses while the provider is on probation (its first `generation.probe_answers` answers). Once its
strikes reach `strikes` and make up at least `share` of everything it returned, it is dropped for the rest of
the run: no new request is routed to it, and the summary says why. Answers from a provider routing did not
keep (a foreign display name: a routing leak, or a kept endpoint whose name drifted) are paid and discarded;
past the same threshold the run stops, because retrying would only buy more discards.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field


@dataclass
class ProviderBreaker:
    strikes: int = 5
    share: float = 0.2
    answers: Counter[str] = field(default_factory=Counter)
    struck: Counter[str] = field(default_factory=Counter)
    reasons: dict[str, Counter[str]] = field(default_factory=dict)
    dropped: dict[str, str] = field(default_factory=dict)  # provider -> why, in one line
    foreign: Counter[str] = field(default_factory=Counter)

    def answered(self, provider: str) -> None:
        self.answers[provider] += 1

    def strike(self, provider: str, reason: str) -> bool:
        """Count one unusable answer or error; True when this one drops the provider."""
        self.struck[provider] += 1
        self.reasons.setdefault(provider, Counter())[reason] += 1
        if provider in self.dropped or not self._tripped(self.struck[provider], self.answers[provider]):
            return False
        causes = ", ".join(f"{why} x{n}" for why, n in self.reasons[provider].most_common())
        self.dropped[provider] = (
            f"{self.struck[provider]} unusable of {self.struck[provider] + self.answers[provider]} "
            f"returned ({causes})"
        )
        return True

    def discarded(self, provider: str) -> bool:
        """Count one answer from a provider routing did not keep; True when the run should stop."""
        self.foreign[provider] += 1
        total = sum(self.foreign.values())
        return self._tripped(total, sum(self.answers.values()))

    def _tripped(self, strikes: int, good: int) -> bool:
        return strikes >= self.strikes and strikes >= self.share * (strikes + good)

    def report(self) -> dict[str, object]:
        return {
            "dropped": dict(self.dropped),
            "strikes": {name: dict(reasons) for name, reasons in sorted(self.reasons.items())},
            "discarded_from": dict(self.foreign),
        }
