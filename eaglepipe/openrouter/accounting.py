"""What a set's requests brought and cost: the summary's tallies, and each reply booked in the ledger.

Every answer counts at its reported usage; one without a count is taken at `max_tokens` and one without a
cost stays unresolved in the run-wide ledger until `/generation` prices it, so budgets stay upper bounds.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from eaglepipe.openrouter.budget import Forecast
from eaglepipe.openrouter.console import ProviderStats
from eaglepipe.openrouter.errors import OpenRouterError
from eaglepipe.openrouter.journal import FailureRecord
from eaglepipe.openrouter.ledger import RunLedger
from eaglepipe.openrouter.replies import RequestFailed
from eaglepipe.openrouter.taxonomy import Observed
from eaglepipe.prompts.records import PromptRecord
from eaglepipe.responses import ResponseRecord

if TYPE_CHECKING:
    from eaglepipe.openrouter.client import GenerationSummary

log = logging.getLogger(__name__)


class Tally:
    """This job's counts for its summary: prompts done (resumed or now) and failed, tokens and dollars,
    errors by class and answers and errors by provider. Each answer also teaches `forecast` its length."""

    def __init__(self, summary: GenerationSummary, max_tokens: int, forecast: Forecast) -> None:
        self.summary = summary
        self.max_tokens = max_tokens
        self.forecast = forecast
        # Prompts with a journaled answer under this fingerprint (resumed or done now).
        self.done_ids: set[str] = set()
        self.tokens_this_run = 0
        self.dollars_this_run = 0.0
        self.errors: Counter[str] = Counter()
        self.provider_stats: dict[str, ProviderStats] = {}

    def resume(
        self,
        prompts: list[PromptRecord],
        reusable: dict[str, ResponseRecord],
        failed: dict[str, FailureRecord],
    ) -> list[PromptRecord]:
        """Counts the prompts answered already (`reusable`, by prompt id) and those an earlier run recorded
        as failed for good (`failed`); returns the rest, to send."""
        todo, seen = [], set()
        for prompt in prompts:
            if prompt["id"] in seen:
                raise OpenRouterError(
                    f"prompt id {prompt['id']} appears twice in the set: rebuild the prompt set"
                )
            seen.add(prompt["id"])
            if prompt["id"] in reusable:
                self.count_done(reusable[prompt["id"]], resumed=True)
            elif prompt["id"] in failed:
                earlier = failed[prompt["id"]]
                self.summary.failed_permanent += 1
                error = f"{earlier.get('error')} (an earlier run's; generation.retry_failed asks again)"
                self.summary.failures.append(
                    {
                        "prompt_id": prompt["id"],
                        "status": earlier.get("status"),
                        "error": error,
                        "attempts": 0,
                        "permanent": True,
                    }
                )
            else:
                todo.append(prompt)
        return todo

    def count_done(self, record: ResponseRecord, *, resumed: bool) -> None:
        usage = record.get("usage") or {}
        # Unknown usage (a server that reports none) counts as max_tokens: the budget stays an upper bound.
        tokens = usage.get("completion_tokens")
        tokens = self.max_tokens if tokens is None else tokens
        cost = usage.get("cost") or 0.0
        self.done_ids.add(record["prompt_id"])
        self.summary.done += 1
        self.summary.completion_tokens += tokens
        self.summary.dollars += cost
        self.summary.truncated += record["response"]["finish_reason"] == "length"
        self.forecast.observe(tokens, cost, record.get("latency_s"))
        if resumed:
            self.summary.resumed += 1
        else:
            self.tokens_this_run += tokens
            self.dollars_this_run += cost
            self.provider(record.get("provider")).add_response(record)

    def count_recovered(self, record: ResponseRecord) -> None:
        """An answer journaled from `/generation/content` at the end: its prompt's failures are undone."""
        prompt_id = record["prompt_id"]
        for failure in [failure for failure in self.summary.failures if failure["prompt_id"] == prompt_id]:
            self.summary.failures.remove(failure)
            if failure["permanent"]:
                self.summary.failed_permanent -= 1
            else:
                self.summary.failed_transient -= 1
        self.count_done(record, resumed=False)

    def provider(self, name: str | None) -> ProviderStats:
        return self.provider_stats.setdefault(name or "(unnamed)", ProviderStats())

    def count_error(self, failure: RequestFailed) -> None:
        self.errors[failure.error_class] += 1
        if failure.provider:
            self.provider(failure.provider).errors += 1

    def count_failure(
        self, prompt_id: str, failure: RequestFailed, attempts: int, *, permanent: bool
    ) -> None:
        if permanent:
            self.summary.failed_permanent += 1
        else:
            self.summary.failed_transient += 1
        self.summary.failures.append(
            {
                "prompt_id": prompt_id,
                "status": failure.status,
                "error": failure.detail,
                "attempts": attempts,
                "permanent": permanent,
            }
        )
        log.warning("prompt %s failed after %d attempt(s): %s", prompt_id, attempts, failure)

    def close(self, ledger: RunLedger | None, dataset: str) -> None:
        """The summary's figures at the end: errors, providers, and the ledger's word on what was billed."""
        summary = self.summary
        summary.errors_by_class = dict(self.errors)
        summary.providers = {name: stats.row() for name, stats in sorted(self.provider_stats.items())}
        if ledger is not None:
            view = ledger.view.refresh()
            summary.run_dollars = view.usd
            summary.billed_by_outcome = dict(ledger.outcomes)
            summary.job_ledger_dollars = ledger.usd_billed
            summary.unresolved = len(view.unresolved_of(dataset))


async def bill(
    ledger: RunLedger,
    prompt_id: str,
    reply: Mapping[str, Any],
    *,
    outcome: str,
    journaled: bool = False,
    cause: str | None = None,
) -> None:
    """Book an answer at its reported cost (`journaled`: see `RunLedger.billed`). One without a cost (a
    stream that ended without its usage chunk, `cost: null`) is not booked at $0: it stays unresolved,
    held at its worst case, until `/generation` prices it."""
    usage = reply.get("usage") or {}
    if usage.get("cost") is None and reply.get("generation_id"):
        await ledger.ensure_started(prompt_id, reply["generation_id"])
        return
    await ledger.billed(
        prompt_id,
        reply.get("generation_id"),
        usd=usage.get("cost") or 0.0,
        outcome=outcome,
        completion_tokens=usage.get("completion_tokens"),
        provider=reply.get("provider"),
        journaled=journaled,
        cause=cause,
    )


async def close_failed(ledger: RunLedger, prompt_id: str, failure: RequestFailed) -> None:
    """A failure that carried a cost is charged. One that answered (HTTP error or an error in the body)
    closes its `started` line at zero; a cut connection leaves it open for `/generation` to settle."""
    answered = failure.kind in {Observed.HTTP, Observed.ERROR_IN_200, Observed.EMPTY_CHOICES}
    if failure.generation_id and (answered or failure.cost):
        await ledger.billed(
            prompt_id,
            failure.generation_id,
            usd=failure.cost or 0.0,
            outcome="error",
            provider=failure.provider,
            cause=failure.error_class,
        )
