"""Whether one more request may start: the live concurrency, the budgets, and the key's first wave.

A request starts only while fewer than the live limit are in flight (`concurrency.py`: the run's
concurrency split among the jobs running now, lowered by 429 storms) and the output-token and dollar
budgets still hold it at the forecast of what the requests in flight will bring (`budget.py`). The first
wave starts at what the key's `limit_remaining` can reserve, since OpenRouter reserves each request's
worst case up front.
"""

from __future__ import annotations

import logging
import time

from eaglepipe.openrouter.billing_api import KeyState
from eaglepipe.openrouter.budget import REFIT_EVERY_S, Forecast
from eaglepipe.openrouter.concurrency import AdaptiveLimit
from eaglepipe.openrouter.dollars import DollarBudget
from eaglepipe.openrouter.ledger import OtherJobs, RunLedger
from eaglepipe.prompts.records import PromptRecord
from eaglepipe.prompts.size import prompt_json_bytes

log = logging.getLogger(__name__)


def prompt_tokens_bound(prompt: PromptRecord) -> int:
    """A generous bound on a prompt's tokens without its tokenizer: half its UTF-8 bytes (tokenizers
    average three to four bytes a token in English, and no fewer than two in scripts of multi-byte
    characters)."""
    return prompt_json_bytes(prompt) // 2


class Admission:
    """This job's requests in flight and what they may still cost, against the live limit and the budgets.
    `live_ids` are the generation ids of those requests: their cost is in the forecast, not in the
    ledger's unresolved reserve."""

    def __init__(
        self,
        *,
        dataset: str,
        concurrency: int,
        max_tokens: int,
        expected_request_usd: float,
        prompt_usd_per_token: float,
        output_token_budget: int | None,
        dollar_budget: DollarBudget | None,
    ) -> None:
        self.dataset = dataset
        self.concurrency = concurrency
        self.expected_request_usd = expected_request_usd
        self.prompt_usd_per_token = prompt_usd_per_token
        self.output_token_budget = output_token_budget
        self.dollar_budget = dollar_budget
        self.limit = AdaptiveLimit(concurrency)
        self.forecast = Forecast(max_tokens, expected_request_usd)
        self.others = OtherJobs()
        self.in_flight = 0
        self.live_ids: set[str] = set()
        self.first_wave: int | None = None
        self.first_wave_note = ""
        # Until this (monotonic) time a rate-limit window is closed: nothing new goes out.
        self.held_until = 0.0

    def size_first_wave(self, key: KeyState | None, todo: list[PromptRecord]) -> None:
        """OpenRouter reserves each request's worst case, (prompt + max_tokens) at the endpoint's price,
        against what the key may still spend: a first wave of more than fits meets in-flight-budget 402s
        at once. The wave starts at what fits; the adaptive limit takes over from there."""
        wave_prompts = todo[: self.concurrency]
        prompt_tokens = max((prompt_tokens_bound(prompt) for prompt in wave_prompts), default=0)
        per_request = self.expected_request_usd + self.prompt_usd_per_token * prompt_tokens
        if key is None or key.limit_remaining is None or per_request <= 0:
            return
        wave = max(1, int(key.limit_remaining / per_request))
        if wave >= min(self.limit.current, len(wave_prompts)):
            return
        self.limit.start_at(wave)
        self.first_wave = wave
        self.first_wave_note = (
            f"first wave {wave}: the key's ${key.limit_remaining:.4f} left holds {wave} reservation(s) of "
            f"${per_request:.4f}"
        )
        log.info("%s: %s", self.dataset, self.first_wave_note)

    def try_start(self, prompt_id: str, tokens_done: int, ledger: RunLedger | None) -> tuple[str, str] | None:
        """None: `prompt_id` is in flight now. ("wait", "") while the limit is full or requests in flight
        may leave room, else (reason, message) for the run to stop on. `tokens_done`: the set's completion
        tokens so far, resumed ones included."""
        if self.in_flight >= self.limit.current or time.monotonic() < self.held_until:
            return "wait", ""
        verdict = self._budget_verdict(tokens_done, ledger)
        if verdict is None:
            self.in_flight += 1
            self.forecast.admit(prompt_id)
        return verdict

    def finish(self, prompt_id: str) -> None:
        self.in_flight -= 1
        self.forecast.finish(prompt_id)

    def hold_for(self, seconds: float) -> None:
        """A rate-limit window said it is closed for `seconds`: new requests wait (the tick, once a
        second, wakes the feeder to look again)."""
        self.held_until = max(self.held_until, time.monotonic() + seconds)

    def held_s(self) -> float:
        return max(0.0, self.held_until - time.monotonic())

    def record_attempt(self, *, rate_limited: bool) -> None:
        """A failed attempt, for the limit's 429 storm detection."""
        self.limit.record(rate_limited=rate_limited)

    def tick(self, others: OtherJobs) -> None:
        """Once a second: the run's concurrency shared with the jobs running now, then the limit adapts."""
        self.others = others
        self.limit.set_ceiling(self.concurrency // (1 + others.count))
        self.limit.tick()

    def _budget_verdict(self, tokens_done: int, ledger: RunLedger | None) -> tuple[str, str] | None:
        """None to admit, ("wait", "") while requests in flight may leave room, else (reason, message)."""
        budget = self.output_token_budget
        dollars = self.dollar_budget
        if budget is not None or dollars is not None:
            self.forecast.refresh(max_age_s=REFIT_EVERY_S)
        if budget is not None and tokens_done + self.forecast.committed_tokens() > budget:
            if self.in_flight:
                return "wait", ""
            return "token_budget", (
                f"output_token_budget {budget} reached ({tokens_done} completion tokens done)"
            )
        if dollars is not None and ledger is not None:
            spent = ledger.view.refresh().usd
            committed = spent + self.reserved_elsewhere(ledger) + self.forecast.committed_usd()
            if committed > dollars.run_usd:
                if self.in_flight or self.others.in_flight:
                    return "wait", ""
                return "dollar_budget", (
                    f"budget.usd {dollars.run_usd:g} reached (${spent:.4f} spent by the run): "
                    "raise budget.usd to go on"
                )
            if dollars.set_usd is not None:
                return self._share_verdict(ledger, dollars.set_usd)
        return None

    def _share_verdict(self, ledger: RunLedger, share: float) -> tuple[str, str] | None:
        """Under budget.policy `share`: this set's own spending, every run of it included, against its
        part of budget.usd; what is in flight elsewhere belongs to other sets' parts."""
        spent = ledger.view.usd_by_set.get(self.dataset, 0.0)
        unpriced = ledger.view.unresolved_count_of(self.dataset, self.live_ids)
        worst = self.expected_request_usd or self.forecast.mean_usd
        if spent + unpriced * worst + self.forecast.committed_usd() <= share:
            return None
        if self.in_flight:
            return "wait", ""
        return "dollar_budget", (
            f"this set's share of budget.usd reached (${spent:.4f} of ${share:.4f}, "
            "budget.policy share): raise budget.usd to buy the rest"
        )

    def reserved_elsewhere(self, ledger: RunLedger | None) -> float:
        """Dollars other jobs have in flight, plus this set's requests that may have been billed but are
        not priced yet (cut off, killed, answered without a cost; unresolved in the ledger and not in
        flight here), each at its worst case: nothing is counted at $0 without proof."""
        if ledger is None:
            return self.others.expected_usd_in_flight
        unpriced = ledger.view.unresolved_count_of(self.dataset, self.live_ids)
        worst = self.expected_request_usd or self.forecast.mean_usd
        return self.others.expected_usd_in_flight + unpriced * worst
