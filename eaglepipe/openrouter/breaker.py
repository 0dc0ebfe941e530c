"""Per-provider circuit breaker: stop paying a provider whose answers cannot be used.

Only evidence counts, as the taxonomy's rows say (`taxonomy.Shape.strike`): a provider 400
(`metadata.provider_name`), an HTTP 200 that is not an answer, and an answer the token stage's structural
check refuses while the provider is on probation (its first `generation.probe_answers` answers) are each a
strike. Once a provider's strikes reach `strikes` and make up at least `share` of what it returned, it is
dropped for the rest of the run: no new request is routed to it, and the summary says why. The share
is over its last `RECENT` returns, so a provider that goes bad halfway is dropped within a few dozen.
Throttling (429, 529, an in-flight budget) is never a strike: at 2000 in flight a busy provider answers
dozens of 429s a second, and dropping it would stop a run that only had to slow down. A provider's own 5xx
counts only when it keeps failing there alone: `SERVER_ERROR_FACTOR` times the strikes, at least half of
its recent returns, and another kept provider still in use (a 5xx burst of the only provider is retried, and
what stays unanswered is left for a rerun, not turned into a stop). Answers from a provider routing did
not keep (a foreign display name: a routing leak, or a kept endpoint whose name drifted) are paid and
discarded; past the same threshold the run stops, because retrying would only buy more discards.
"""

from __future__ import annotations

import logging
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import anyio.to_thread

from eaglepipe.openrouter.taxonomy import Observed
from eaglepipe.prompts.records import PromptRecord
from eaglepipe.responses import ResponseRecord

if TYPE_CHECKING:
    from eaglepipe.openrouter.replies import RequestFailed

log = logging.getLogger(__name__)

SERVER_ERROR_FACTOR = 4
SERVER_ERROR_SHARE = 0.5
# The share of a provider's returns that are strikes is judged over its last RECENT returns, not the run's:
# a provider that goes bad after 10,000 good answers is dropped after about `share` x RECENT bad ones, not
# after `share` x 10,000.
RECENT = 50


@dataclass
class ProviderBreaker:
    strikes: int = 5
    share: float = 0.2
    answers: Counter[str] = field(default_factory=Counter)
    struck: Counter[str] = field(default_factory=Counter)
    server_errors: Counter[str] = field(default_factory=Counter)
    reasons: dict[str, Counter[str]] = field(default_factory=dict)
    dropped: dict[str, str] = field(default_factory=dict)  # provider -> why, in one line
    foreign: Counter[str] = field(default_factory=Counter)
    # Each provider's last RECENT returns: "answer", "unusable" or "server_error".
    recent: dict[str, deque[str]] = field(default_factory=dict)

    def answered(self, provider: str) -> None:
        self.answers[provider] += 1
        self._returned(provider, "answer")

    def strike(self, provider: str, reason: str) -> bool:
        """Count one unusable answer or error; True when this one drops the provider."""
        self.struck[provider] += 1
        self.reasons.setdefault(provider, Counter())[reason] += 1
        share = self._returned(provider, "unusable")
        if provider in self.dropped or self.struck[provider] < self.strikes or share < self.share:
            return False
        return self._drop(provider, self.struck[provider], "unusable")

    def server_error(self, provider: str, reason: str, *, others_in_use: bool) -> bool:
        """Count one 5xx the provider itself returned; True when this one drops it."""
        self.server_errors[provider] += 1
        self.reasons.setdefault(provider, Counter())[reason] += 1
        share = self._returned(provider, "server_error")
        if (
            provider in self.dropped
            or not others_in_use
            or self.server_errors[provider] < SERVER_ERROR_FACTOR * self.strikes
            or share < SERVER_ERROR_SHARE
        ):
            return False
        return self._drop(provider, self.server_errors[provider], "server errors")

    def _returned(self, provider: str, what: str) -> float:
        """Record one return; the share of `what` among the provider's recent returns."""
        recent = self.recent.setdefault(provider, deque(maxlen=RECENT))
        recent.append(what)
        return recent.count(what) / len(recent)

    def _drop(self, provider: str, failed: int, what: str) -> bool:
        recent = self.recent[provider]
        causes = ", ".join(f"{why} x{n}" for why, n in self.reasons[provider].most_common())
        self.dropped[provider] = (
            f"{failed} {what} of {failed + self.answers[provider]} returned, "
            f"{recent.count(recent[-1])} of its last {len(recent)} ({causes})"
        )
        return True

    def discarded(self, provider: str) -> bool:
        """Count one answer from a provider routing did not keep; True when the run should stop."""
        self.foreign[provider] += 1
        total, good = sum(self.foreign.values()), sum(self.answers.values())
        return total >= self.strikes and total >= self.share * (total + good)

    def report(self) -> dict[str, object]:
        return {
            "dropped": dict(self.dropped),
            "strikes": {name: dict(reasons) for name, reasons in sorted(self.reasons.items())},
            "discarded_from": dict(self.foreign),
        }


class ProviderHealth:
    """The run's side of the breaker: the usability probe on each provider's first `probe_answers`
    answers, strikes that drop a provider, and `stop` (reason, message) once no allowed provider is left
    or foreign answers keep coming. `probe` says why an answer to a prompt cannot be trained on, or None."""

    def __init__(
        self,
        breaker: ProviderBreaker,
        *,
        dataset: str,
        allowed_providers: tuple[str, ...],
        probe: Callable[[PromptRecord, ResponseRecord], str | None] | None,
        probe_answers: int,
        stop: Callable[[str, str], None],
    ) -> None:
        self.breaker = breaker
        self.dataset = dataset
        self.allowed_providers = allowed_providers
        self.probe = probe
        self.probe_answers = probe_answers
        self.probed: Counter[str] = Counter()
        self._stop = stop

    def dropped(self) -> frozenset[str]:
        """The providers the breaker dropped, in lower case as routing compares names."""
        return frozenset(name.lower() for name in self.breaker.dropped)

    def judge(self, failure: RequestFailed) -> None:
        """What a failed attempt proves about its provider, as its taxonomy row says."""
        shape = failure.shape
        if failure.kind == Observed.FOREIGN_PROVIDER:
            self.discarded(str(failure.provider))
        elif shape.strike == "unusable":
            self.strike(failure.provider_name or failure.provider or "(unnamed)", shape.name)
        elif shape.strike == "server_error" and failure.provider_name:
            dropped = self.dropped()
            others = any(
                name.lower() != failure.provider_name.lower() and name.lower() not in dropped
                for name in self.allowed_providers
            )
            if self.breaker.server_error(failure.provider_name, shape.name, others_in_use=others):
                self._dropped(failure.provider_name)

    def strike(self, provider: str, reason: str) -> None:
        """One unusable answer or error from `provider`; the breaker may drop it, and with it the run."""
        if self.breaker.strike(provider, reason):
            self._dropped(provider)

    def _dropped(self, provider: str) -> None:
        log.warning(
            "%s: provider %s dropped for the rest of the run: %s",
            self.dataset,
            provider,
            self.breaker.dropped[provider],
        )
        dropped = self.dropped()
        # Without an allowlist (any server, self-hosted) nothing can be routed around the provider: stop.
        left = [name for name in self.allowed_providers if name.lower() not in dropped]
        if not left:
            reasons = "; ".join(f"{name}: {why}" for name, why in self.breaker.dropped.items())
            self._stop(
                "no_usable_provider",
                f"no usable provider is left ({reasons}): read their answers in the journal, `ignore` them "
                "in `routing` and refresh providers.json (`.venv/bin/snakemake --forcerun providers`), "
                "then rerun",
            )

    def discarded(self, provider: str) -> None:
        if self.breaker.discarded(provider):
            names = ", ".join(f"{name!r} x{n}" for name, n in self.breaker.foreign.most_common())
            self._stop(
                "foreign_provider",
                f"answers kept coming from providers routing did not keep ({names}), each paid and "
                "discarded: if one is a kept endpoint under a new display name, refresh providers.json "
                "(`.venv/bin/snakemake --forcerun providers`), then rerun",
            )

    async def check_usable(self, prompt: PromptRecord, record: ResponseRecord) -> None:
        """The usability probe: a provider's first answers go through the token stage's structural check."""
        provider = str(record.get("provider") or "(unnamed)")
        self.breaker.answered(provider)
        if self.probe is None or self.probed[provider] >= self.probe_answers:
            return
        self.probed[provider] += 1
        problem = await anyio.to_thread.run_sync(self.probe, prompt, record)
        if problem is not None:
            log.warning(
                "prompt %s: the answer of %s cannot be trained on (the token stage's check: %s): kept in the "
                "journal, the token stage drops it; a strike against %s, whom enough strikes drop "
                "(generation.breaker_strikes): nothing to do unless providers get dropped",
                prompt["id"],
                provider,
                problem,
                provider,
            )
            self.strike(provider, f"unusable answer: {problem}")

    def report(self) -> dict[str, object]:
        """The summary's `breaker`: dropped providers and why, strikes, discards by foreign provider."""
        return self.breaker.report()
