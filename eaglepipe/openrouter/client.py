"""Sending a prompt set to an OpenRouter-compatible API, each finished prompt journaled before it counts.

A fixed pool of `concurrency` workers reads prompts from a bounded stream; the feeder admits a prompt
only when the live concurrency has room, the run is not stopping and the budgets allow it (see
`budget.py`). Once a second a housekeeping tick re-reads the run-wide ledger, beats this job's heartbeat,
splits the run's concurrency among the jobs running now, adapts it to 429s and redraws the progress line.
Failures are sorted by what helps (`verdict.py`, by status and OpenRouter's error metadata): transient
ones are retried, in-flight-budget 402s and 429s also lower the live concurrency, permanent ones are
recorded, and credit, key and budget limits stop new requests while those in flight finish, so everything
paid for is kept and a rerun resumes.
"""

from __future__ import annotations

import contextlib
import logging
import math
import random
import resource
import ssl
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

import anyio
import anyio.to_thread
import certifi
import httpx
from anyio.streams.memory import MemoryObjectReceiveStream

from eaglepipe.openrouter.answer_transport import ChatRoute, answer_transport
from eaglepipe.openrouter.appendlog import AppendLog
from eaglepipe.openrouter.breaker import ProviderBreaker
from eaglepipe.openrouter.budget import REFIT_EVERY_S, Forecast
from eaglepipe.openrouter.concurrency import AdaptiveLimit
from eaglepipe.openrouter.console import ProgressLine, ProviderStats, provider_table
from eaglepipe.openrouter.errors import OpenRouterError, one_line
from eaglepipe.openrouter.journal import open_journal, read_records, reusable
from eaglepipe.openrouter.ledger import Heartbeat, OtherJobs, RunLedger
from eaglepipe.openrouter.recovered import rebuilt_answer
from eaglepipe.openrouter.recovery import KeyState, check_key, generation_contents, recover_generations
from eaglepipe.openrouter.replies import RequestFailed, read_reply, read_streamed_reply
from eaglepipe.openrouter.secrets import ApiKey
from eaglepipe.openrouter.settings import GenerationSettings
from eaglepipe.openrouter.verdict import Verdict, verdict
from eaglepipe.progress import format_eta
from eaglepipe.prompts.size import prompt_json_bytes

log = logging.getLogger(__name__)

# Connections per httpx client (see _http_pools); measured in bench/generation_client.py.
POOL_CONNECTIONS = 50
TICK_S = 1.0
LOG_PROGRESS_EVERY_S = 30.0
KEY_CHECK_EVERY_S = 60.0
OPEN_FILES_BESIDES_SOCKETS = 256
# A request `/generation` still does not know this long after the client's own deadline never was billed:
# only then is it closed at $0 (`not_found`). Until then it is held at its worst case.
UNSEEN_GRACE_S = 600.0
# Throttling answers (429, in-flight-budget 402) say "not now", not "this prompt fails": they do not use up
# `max_attempts`, only this much larger allowance (with Retry-After waits, minutes of trying).
MAX_THROTTLED_RETRIES = 200


class UsabilityProbe(Protocol):
    def __call__(self, prompt: dict[str, Any], record: dict[str, Any]) -> str | None:
        """Why the journaled answer `record` to `prompt` cannot be trained on, or None."""
        ...


@dataclass
class GenerationSummary:
    """Why the set ended and what it holds; token and dollar totals cover every done prompt, resumed ones
    included, because the set's cost is what the budget and the user care about."""

    requested: int
    done: int = 0
    resumed: int = 0
    failed_permanent: int = 0
    failed_transient: int = 0
    truncated: int = 0
    retries: int = 0
    completion_tokens: int = 0
    dollars: float = 0.0
    ended_because: str = "all_done"
    message: str = ""
    # Run-wide dollars per the ledger when the set ended, and this job's billed requests by outcome.
    run_dollars: float = 0.0
    billed_by_outcome: dict[str, int] = field(default_factory=dict)
    errors_by_class: dict[str, int] = field(default_factory=dict)
    recovered: int = 0
    unresolved: int = 0
    concurrency_lowest: int = 0
    concurrency_cuts: int = 0
    # The key's own usage before and after (GET /key), to reconcile with the ledger.
    key_usage_start: float | None = None
    key_usage_end: float | None = None
    # The first wave's concurrency when the key's limit_remaining held fewer requests' reservations.
    first_wave: int | None = None
    job_ledger_dollars: float = 0.0
    providers: dict[str, dict[str, Any]] = field(default_factory=dict)
    # The circuit breaker: providers dropped (and why), strikes by provider, discards by foreign provider.
    breaker: dict[str, Any] = field(default_factory=dict)
    probed: dict[str, int] = field(default_factory=dict)
    failures: list[dict[str, Any]] = field(default_factory=list)
    emulated: bool = False
    max_tokens: int = 0

    def to_json(self) -> dict[str, Any]:
        """The summary file, with what a reader would otherwise have to look up: what `truncated` counts,
        and that an emulated run's providers and dollars are not real."""
        notes = {
            "truncated": f"answers cut at generation.max_tokens ({self.max_tokens}) before the model "
            "finished (finish_reason: length); they are kept and trained on; raise it for whole answers",
        }
        if self.emulated:
            notes["emulated"] = (
                "api.base_url: local: the providers and dollars are the local emulator's simulation; "
                "nothing was bought"
            )
        return {**asdict(self), "notes": notes}


async def generate_set(
    prompts: list[dict[str, Any]],
    *,
    settings: GenerationSettings,
    api_key: ApiKey | None,
    journal_dir: Path,
    ledger_dir: Path,
    dataset: str,
    probe: UsabilityProbe | None = None,
) -> GenerationSummary:
    """Generate every prompt not yet journaled under `settings.fingerprint`; never raises for failed
    requests (the summary says what happened), only for unusable input. `probe` checks each provider's
    first `settings.probe_answers` answers (the token stage's structural check) as they arrive."""
    _raise_open_file_limit(settings.concurrency)
    summary = GenerationSummary(
        requested=len(prompts), emulated=settings.emulated, max_tokens=settings.max_tokens
    )
    run = _Run(settings, summary, dataset, probe)
    run.prompts = {prompt["id"]: prompt for prompt in prompts}
    journaled = read_records(journal_dir)  # read once: resume and the ledger settlement both need it
    earlier = reusable(journaled, settings.fingerprint)
    run.done_ids.update(earlier)
    heartbeat = Heartbeat(ledger_dir, dataset)
    async with contextlib.AsyncExitStack() as stack:
        routes = _http_pools(settings, api_key)
        for route in routes:
            await stack.enter_async_context(route.http)
        journal = await stack.enter_async_context(open_journal(journal_dir))
        ledger = await stack.enter_async_context(RunLedger(ledger_dir, dataset))
        http = routes[0].http  # also for /key and /generation
        run.ledger, run.http, run.journal = ledger, http, journal
        # Settled before the prompts are counted: an answer an earlier run lost, journaled now from
        # `/generation/content`, is resumed rather than bought again.
        recovered = await _settle_earlier_runs(run, journaled)
        todo = run.resume(prompts, {**earlier, **reusable(recovered, settings.fingerprint)})
        log.info(
            "%s: generating %d of %d prompts (%d resumed), fingerprint %s, concurrency %d, %s",
            dataset,
            len(todo),
            len(prompts),
            run.summary.resumed,
            settings.fingerprint,
            settings.concurrency,
            "streamed" if settings.stream else "not streamed",
        )
        run.size_first_wave(await _check_key(run), todo)
        try:
            async with anyio.create_task_group() as housekeeping:
                housekeeping.start_soon(_tick_forever, run, heartbeat)
                await _feed_workers(todo, routes, journal, run)
                housekeeping.cancel_scope.cancel()
        finally:
            heartbeat.remove()
        for record in await _recover(run, at_end=True):
            run.count_recovered(record)
        key = await check_key(http)
        run.summary.key_usage_end = key.usage if key else None
    run.finish()
    if settings.progress:
        run.progress.close(run.progress_line())
    log.info("%s: generation ended (%s): %s", dataset, run.summary.ended_because, run.progress_line())
    if run.provider_stats:
        log.info(
            "%s: per provider%s (trunc: answers cut at max_tokens %d)\n%s",
            dataset,
            " (emulated: simulated providers and prices)" if settings.emulated else "",
            settings.max_tokens,
            provider_table(run.provider_stats),
        )
    return run.summary


class _Run:
    """State shared by the feeder, the workers and the housekeeping tick (one event loop: no locks)."""

    def __init__(
        self,
        settings: GenerationSettings,
        summary: GenerationSummary,
        dataset: str,
        probe: UsabilityProbe | None = None,
    ) -> None:
        self.settings = settings
        self.breaker = ProviderBreaker(settings.breaker_strikes, settings.breaker_share)
        self.probe = probe
        self.probed: Counter[str] = Counter()
        self.summary = summary
        self.dataset = dataset
        self.ledger: RunLedger | None = None
        self.http: httpx.AsyncClient | None = None
        self.journal: AppendLog | None = None
        self.prompts: dict[str, dict[str, Any]] = {}
        # Prompts with a journaled answer under this fingerprint (resumed or done now).
        self.done_ids: set[str] = set()
        self.limit = AdaptiveLimit(settings.concurrency)
        self.others = OtherJobs()
        self.changed = anyio.Event()
        self.stopping = anyio.Event()
        self.stop_reason: str | None = None
        self.in_flight = 0
        # Generation ids of this job's requests in flight: their cost is in the forecast, not in the
        # ledger's unresolved reserve.
        self.live_ids: set[str] = set()
        self.forecast = Forecast(settings.max_tokens, settings.expected_request_usd)
        self.tokens_this_run = 0
        self.dollars_this_run = 0.0
        self.errors: Counter[str] = Counter()
        self.provider_stats: dict[str, ProviderStats] = {}
        self.progress = ProgressLine()
        self.first_wave_note = ""
        self.started = time.monotonic()

    # --- accounting ------------------------------------------------------------------------------

    def resume(
        self, prompts: list[dict[str, Any]], reusable: dict[str, dict[str, Any]]
    ) -> list[dict[str, Any]]:
        todo, seen = [], set()
        for prompt in prompts:
            if prompt["id"] in seen:
                raise OpenRouterError(
                    f"prompt id {prompt['id']} appears twice in the set: rebuild the prompt set"
                )
            seen.add(prompt["id"])
            if prompt["id"] in reusable:
                self.count_done(reusable[prompt["id"]], resumed=True)
            else:
                todo.append(prompt)
        return todo

    def count_done(self, record: dict[str, Any], *, resumed: bool) -> None:
        usage = record.get("usage") or {}
        # Unknown usage (a server that reports none) counts as max_tokens: the budget stays an upper bound.
        tokens = usage.get("completion_tokens")
        tokens = self.settings.max_tokens if tokens is None else tokens
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
        self.notify()

    def count_recovered(self, record: dict[str, Any]) -> None:
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

    def count_error(self, failure: RequestFailed, judged: Verdict) -> None:
        self.errors[failure.error_class] += 1
        self.limit.record(rate_limited=judged.action == "throttle")
        if failure.provider:
            self.provider(failure.provider).errors += 1

    def dropped(self) -> frozenset[str]:
        """The providers the breaker dropped, in lower case as routing compares names."""
        return frozenset(name.lower() for name in self.breaker.dropped)

    def request_fields(self) -> dict[str, Any]:
        return self.settings.shared_request_fields(self.dropped())

    def strike(self, provider: str, reason: str) -> None:
        """One unusable answer or error from `provider`; the breaker may drop it, and with it the run."""
        if not self.breaker.strike(provider, reason):
            return
        log.warning(
            "%s: provider %s dropped for the rest of the run: %s",
            self.dataset,
            provider,
            self.breaker.dropped[provider],
        )
        dropped = self.dropped()
        # Without an allowlist (any server, self-hosted) nothing can be routed around the provider: stop.
        left = [name for name in self.settings.allowed_providers if name.lower() not in dropped]
        if not left:
            reasons = "; ".join(f"{name}: {why}" for name, why in self.breaker.dropped.items())
            self.stop(
                "no_usable_provider",
                f"no usable provider is left ({reasons}): read their answers in the journal, `ignore` them "
                "in `routing` and refresh providers.json (`snakemake --forcerun providers`), then rerun",
            )

    def discarded(self, provider: str) -> None:
        if self.breaker.discarded(provider):
            names = ", ".join(f"{name!r} x{n}" for name, n in self.breaker.foreign.most_common())
            self.stop(
                "foreign_provider",
                f"answers kept coming from providers routing did not keep ({names}), each paid and "
                "discarded: if one is a kept endpoint under a new display name, refresh providers.json "
                "(`snakemake --forcerun providers`), then rerun",
            )

    async def check_usable(self, prompt: dict[str, Any], record: dict[str, Any]) -> None:
        """The usability probe: a provider's first answers go through the token stage's structural check."""
        provider = str(record.get("provider") or "(unnamed)")
        self.breaker.answered(provider)
        if self.probe is None or self.probed[provider] >= self.settings.probe_answers:
            return
        self.probed[provider] += 1
        problem = await anyio.to_thread.run_sync(self.probe, prompt, record)
        if problem is not None:
            log.warning(
                "prompt %s: the answer of %s fails the token stage's check (%s)",
                prompt["id"],
                provider,
                problem,
            )
            self.strike(provider, f"unusable answer: {problem}")

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

    def stop(self, reason: str, message: str) -> None:
        """Stop admitting prompts; the first reason wins because later ones are usually its echoes."""
        if self.stop_reason is None:
            self.stop_reason = reason
            self.summary.message = message
            self.stopping.set()
            self.notify()
            log.warning("stopping new requests: %s", message)

    def notify(self) -> None:
        """Wake the feeder: a slot, a budget or the live limit may have changed. A set event stays set
        until the feeder next waits (it takes a fresh one then), so a wake-up costs no new event each."""
        self.changed.set()

    # --- admission -------------------------------------------------------------------------------

    def size_first_wave(self, key: KeyState | None, todo: list[dict[str, Any]]) -> None:
        """OpenRouter reserves each request's worst case, (prompt + max_tokens) at the endpoint's price,
        against what the key may still spend: a first wave of more than fits meets in-flight-budget 402s
        at once. The wave starts at what fits; the adaptive limit takes over from there."""
        settings = self.settings
        wave_prompts = todo[: settings.concurrency]
        prompt_tokens = max((prompt_tokens_bound(prompt) for prompt in wave_prompts), default=0)
        per_request = settings.expected_request_usd + settings.prompt_usd_per_token * prompt_tokens
        if key is None or key.limit_remaining is None or per_request <= 0:
            return
        wave = max(1, int(key.limit_remaining / per_request))
        if wave >= min(self.limit.current, len(wave_prompts)):
            return
        self.limit.start_at(wave)
        self.summary.first_wave = wave
        self.first_wave_note = (
            f"first wave {wave}: the key's ${key.limit_remaining:.4f} left holds {wave} reservation(s) of "
            f"${per_request:.4f}"
        )
        log.info("%s: %s", self.dataset, self.first_wave_note)

    async def admit(self, prompt_id: str) -> bool:
        """Wait until one more request may go out; False once the run stops admitting."""
        while self.stop_reason is None:
            if self.in_flight < self.limit.current:
                verdict = self._budget_verdict()
                if verdict is None:
                    self.in_flight += 1
                    self.forecast.admit(prompt_id)
                    return True
                if verdict[0] != "wait":
                    self.stop(*verdict)
                    break
            # Nothing runs between the checks above and this wait, so no wake-up is missed.
            self.changed = anyio.Event()
            await self.changed.wait()
        return False

    def _budget_verdict(self) -> tuple[str, str] | None:
        """None to admit, ("wait", "") while requests in flight may leave room, else (reason, message)."""
        settings = self.settings
        budget = settings.output_token_budget
        if budget is not None or settings.usd_budget is not None:
            self.forecast.refresh(max_age_s=REFIT_EVERY_S)
        if budget is not None and self.summary.completion_tokens + self.forecast.committed_tokens() > budget:
            if self.in_flight:
                return "wait", ""
            return "token_budget", (
                f"output_token_budget {budget} reached "
                f"({self.summary.completion_tokens} completion tokens done)"
            )
        if settings.usd_budget is not None and self.ledger is not None:
            spent = self.ledger.view.refresh().usd
            committed = spent + self.reserved_elsewhere() + self.forecast.committed_usd()
            if committed > settings.usd_budget:
                if self.in_flight or self.others.in_flight:
                    return "wait", ""
                return "dollar_budget", (
                    f"budget.usd {settings.usd_budget:g} reached (${spent:.4f} spent by the run): "
                    "raise budget.usd to go on"
                )
        return None

    def reserved_elsewhere(self) -> float:
        """Dollars other jobs have in flight, plus this set's requests that may have been billed but are
        not priced yet (cut off, killed, answered without a cost; unresolved in the ledger and not in
        flight here), each at its worst case: nothing is counted at $0 without proof."""
        if self.ledger is None:
            return self.others.expected_usd_in_flight
        unpriced = self.ledger.view.unresolved_count_of(self.dataset, self.live_ids)
        worst = self.settings.expected_request_usd or self.forecast.mean_usd
        return self.others.expected_usd_in_flight + unpriced * worst

    # --- end -------------------------------------------------------------------------------------

    def finish(self) -> None:
        """Permanent failures (400/403) are final answers; transient ones leave the set unfinished for a
        rerun to retry, unless `max_failed_fraction` of the set may stay unanswered."""
        summary = self.summary
        summary.errors_by_class = dict(self.errors)
        summary.concurrency_lowest = self.limit.lowest
        summary.concurrency_cuts = self.limit.cuts
        summary.providers = {name: stats.row() for name, stats in sorted(self.provider_stats.items())}
        summary.breaker = self.breaker.report()
        summary.probed = dict(self.probed)
        if self.ledger is not None:
            view = self.ledger.view.refresh()
            summary.run_dollars = view.usd
            summary.billed_by_outcome = dict(self.ledger.outcomes)
            summary.job_ledger_dollars = self.ledger.usd_billed
            summary.unresolved = len(view.unresolved_of(self.dataset))
        transient = [failure for failure in summary.failures if not failure["permanent"]]
        if self.stop_reason is not None:
            summary.ended_because = self.stop_reason
        elif len(transient) > self.settings.max_failed_fraction * summary.requested:
            first = transient[0]
            summary.ended_because = "failures"
            summary.message = (
                f"{len(transient)} prompt(s) failed transiently, first {first['prompt_id']}: {first['error']}"
            )

    def progress_line(self) -> str:
        elapsed = max(time.monotonic() - self.started, 1e-9)
        summary, new = self.summary, self.summary.done - self.summary.resumed
        left = summary.requested - summary.done - summary.failed_permanent - summary.failed_transient
        rate = new / elapsed
        eta = left / rate if rate > 0 else None
        spent = self.ledger.view.usd if self.ledger else self.dollars_this_run
        projected = spent + left * self.forecast.mean_usd
        errors = " ".join(f"{name}={count}" for name, count in sorted(self.errors.items())) or "none"
        # What OpenRouter holds against the balance for the requests in flight (its in-flight budget).
        reserved = self.in_flight * self.settings.expected_request_usd
        return (
            f"{self.dataset}: {summary.done}/{summary.requested} done, "
            f"{self.tokens_this_run / elapsed:.0f} tok/s, "
            f"${spent:.2f} spent by the run (projected ${projected:.2f}), {self.in_flight} in flight "
            f"(limit {self.limit.current}, ${reserved:.2f} reserved at worst case), errors {errors}, "
            f"ETA {format_eta(eta)}" + (f", {self.first_wave_note}" if self.first_wave_note else "")
        )


async def _tick_forever(run: _Run, heartbeat: Heartbeat) -> None:
    last_log = last_key_check = time.monotonic()
    while True:
        await anyio.sleep(TICK_S)
        run.forecast.refresh(max_age_s=REFIT_EVERY_S)  # admissions may have refit it just now
        await anyio.to_thread.run_sync(heartbeat.beat, run.in_flight, run.forecast.in_flight_usd)
        run.others = heartbeat.others()
        run.limit.set_ceiling(run.settings.concurrency // (1 + run.others.count))
        run.limit.tick()
        run.notify()
        now = time.monotonic()
        if run.settings.progress:
            run.progress.show(run.progress_line(), now)
        if now - last_log >= LOG_PROGRESS_EVERY_S:
            last_log = now
            log.info("%s", run.progress_line())
        if now - last_key_check >= KEY_CHECK_EVERY_S:
            last_key_check = now
            await _check_key(run)


def prompt_tokens_bound(prompt: dict[str, Any]) -> int:
    """A generous bound on a prompt's tokens without its tokenizer: half its UTF-8 bytes (tokenizers
    average three to four bytes a token in English, and no fewer than two in scripts of multi-byte
    characters)."""
    return prompt_json_bytes(prompt) // 2


def _raise_open_file_limit(concurrency: int) -> None:
    """Each request in flight holds a socket; a common soft limit of 1024 files would fail at 2000."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = concurrency + OPEN_FILES_BESIDES_SOCKETS
    if soft == resource.RLIM_INFINITY or soft >= wanted:
        return
    raised = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    resource.setrlimit(resource.RLIMIT_NOFILE, (raised, hard))
    if raised < wanted:
        log.warning(
            "open-file limit %d is below concurrency %d: raise `ulimit -Hn` or lower the concurrency",
            raised,
            concurrency,
        )


def _http_pools(settings: GenerationSettings, api_key: ApiKey | None) -> list[ChatRoute]:
    """Clients of at most POOL_CONNECTIONS connections each, all kept alive. httpcore (1.0.x) scans its
    connection list once per idle connection whenever a request starts or ends, so a pool costs O(size^2)
    per request: 2000 in one pool is hopeless, 250 still dominated the client's CPU, 50 does not (see
    bench/generation_client.py). Capping idle connections instead makes requests pay new connections.
    Chat completions go through `answer_transport`'s own connections (each client's `ChatRoute`), the rest
    through httpx's."""
    count = math.ceil(settings.concurrency / POOL_CONNECTIONS)
    size = math.ceil(settings.concurrency / count)
    tls = ssl.create_default_context(cafile=certifi.where())  # one CA load, not one per client
    routes = []
    for _ in range(count):
        transport = answer_transport(settings.base_url, tls, size)
        http = httpx.AsyncClient(
            verify=tls,
            base_url=settings.base_url.rstrip("/") + "/",
            headers=api_key.authorization_header() if api_key else {},
            # `limits` applies only where a proxy leaves httpx its own transport (answer_transport None).
            limits=httpx.Limits(max_connections=size, max_keepalive_connections=size),
            transport=transport,
            # Read = the longest gap between bytes; no pool timeout: admission caps the waiting requests.
            timeout=httpx.Timeout(settings.request_timeout_s, pool=None),
        )
        routes.append(ChatRoute(http, transport))
    return routes


async def _settle_earlier_runs(run: _Run, journaled: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Before spending: charge journaled answers a killed job never entered in the ledger, and look up
    requests it left in flight or cut off; returns the answers journaled from `/generation/content`."""
    assert run.ledger is not None
    view = run.ledger.view.refresh()
    for record in journaled:
        generation_id = record.get("generation_id")
        if generation_id and generation_id not in view.resolved:
            await _bill(run.ledger, record["prompt_id"], record, outcome="kept")
            view.refresh()
    if view.refresh().unresolved_of(run.dataset):
        return await _recover(run, at_end=False)
    return []


async def _recover(run: _Run, *, at_end: bool) -> list[dict[str, Any]]:
    """Charge requests of this set that were cut off, in flight at a kill or answered without a cost,
    per `/generation`. At the start only what `/generation` knows already; at the end, waiting up to
    `recovery_wait_s` (OpenRouter answers 404 for a while after a generation ends, minutes for long
    answers). One still unknown stays open, held at its worst case, for the next start to settle; it is
    closed at $0 (`not_found`) only once it is older than the longest answer can take plus a grace.
    A found one whose prompt has no answer yet is journaled from `/generation/content` where that holds
    the whole answer (`recovered.py`); those records are returned, for the caller to count."""
    assert run.ledger is not None and run.http is not None and run.journal is not None
    await run.ledger.flush()  # bills written behind count as resolved, not as requests to look up
    pending = run.ledger.view.refresh().unresolved_of(run.dataset)
    if not pending:
        return []
    wait_s = run.settings.recovery_wait_s if at_end else 0.0
    found = await recover_generations(
        run.http, [record["generation_id"] for record in pending], wait_s=wait_s
    )
    rebuilt = await _stored_answers(run, pending, found)
    oldest_billable = time.time() - run.settings.request_timeout_s - UNSEEN_GRACE_S
    for record in pending:
        generation = found.get(record["generation_id"])
        if generation is None and float(record.get("at") or time.time()) > oldest_billable:
            continue
        answer = rebuilt.get(record["generation_id"])
        if answer is not None:  # journaled before it is billed, as every answer: a kill between is settled
            await run.journal.append(answer)
        outcome = "recovered_content" if answer else "recovered" if generation else "not_found"
        await run.ledger.billed(
            record["prompt_id"],
            record["generation_id"],
            usd=generation["usd"] if generation else 0.0,
            outcome=outcome,
            completion_tokens=generation["completion_tokens"] if generation else None,
            provider=generation["provider"] if generation else None,
        )
        run.summary.recovered += generation is not None
    run.ledger.view.refresh()
    log.info(
        "%s: %d cut-off request(s) looked up in /generation, %d found billed, %d answer(s) journaled from "
        "their stored content",
        run.dataset,
        len(pending),
        len(found),
        len(rebuilt),
    )
    return list(rebuilt.values())


async def _stored_answers(
    run: _Run, pending: list[dict[str, Any]], found: dict[str, dict[str, Any]]
) -> dict[str, dict[str, Any]]:
    """{generation id: journal record} for found requests whose prompt (of this set, asked under this
    fingerprint) has no answer yet and whose stored content is the whole answer; one per prompt, the first
    of its cut attempts that qualifies."""
    assert run.http is not None
    settings = run.settings
    candidates: dict[str, list[dict[str, Any]]] = {}
    for record in pending:
        prompt_id = record["prompt_id"]
        if (
            record["generation_id"] in found
            and record.get("fingerprint") == settings.fingerprint
            and prompt_id in run.prompts
            and prompt_id not in run.done_ids
        ):
            candidates.setdefault(prompt_id, []).append(record)
    if not candidates:
        return {}
    contents = await generation_contents(
        run.http, [record["generation_id"] for attempts in candidates.values() for record in attempts]
    )
    allowed = frozenset(name.lower() for name in settings.allowed_providers)
    rebuilt: dict[str, dict[str, Any]] = {}
    for prompt_id, attempts in candidates.items():
        for record in attempts:
            generation_id = record["generation_id"]
            if generation_id not in contents:
                continue
            prompt, content = run.prompts[prompt_id], contents[generation_id]
            answer, why = rebuilt_answer(prompt, found[generation_id], content, allowed)
            if answer is None:
                log.info(
                    "prompt %s: the stored content of %s is not journaled: %s", prompt_id, generation_id, why
                )
                continue
            rebuilt[generation_id] = {
                "prompt_id": prompt_id,
                "fingerprint": settings.fingerprint,
                "request": run.request_fields(),
                **answer,
                "generation_id": generation_id,
                "latency_s": None,
                "attempts": None,
                "recovered_content": True,
            }
            break
    return rebuilt


async def _check_key(run: _Run) -> KeyState | None:
    """A key whose own limit is spent stops the run, as OpenRouter's 403 openrouter_key_limit would, even
    before any request says so. None: the key's state is unknown (no `/key`, or it failed this time)."""
    assert run.http is not None
    key = await check_key(run.http)
    if key is None:
        return None
    if run.summary.key_usage_start is None:
        run.summary.key_usage_start = key.usage
    if key.limit_remaining is not None and key.limit_remaining < run.forecast.mean_usd:
        run.stop(
            "key_limit",
            f"the key's limit_remaining is ${key.limit_remaining:.4f}, less than one request: "
            "raise the key's limit (or wait until it resets), then rerun",
        )
    return key


async def _feed_workers(
    todo: list[dict[str, Any]], routes: list[ChatRoute], journal: AppendLog, run: _Run
) -> None:
    """Worker i sends through pool i mod n, so every pool carries an equal share of the requests."""
    settings = run.settings
    send, receive = anyio.create_memory_object_stream[dict[str, Any]](0)
    async with anyio.create_task_group() as workers:
        for number in range(min(settings.concurrency, len(todo))):
            workers.start_soon(_worker, receive.clone(), routes[number % len(routes)], journal, run)
        receive.close()
        async with send:
            for prompt in todo:
                if not await run.admit(prompt["id"]):
                    break
                await send.send(prompt)


async def _worker(
    prompts: MemoryObjectReceiveStream[dict[str, Any]], route: ChatRoute, journal: AppendLog, run: _Run
) -> None:
    async with prompts:
        async for prompt in prompts:
            try:
                await _complete_prompt(prompt, route, journal, run)
            finally:
                run.in_flight -= 1
                run.forecast.finish(prompt["id"])
                run.notify()


async def _complete_prompt(prompt: dict[str, Any], route: ChatRoute, journal: AppendLog, run: _Run) -> None:
    """Try until done, failed for good, or the run is stopping (then the prompt stays to resume)."""
    settings, ledger = run.settings, run.ledger
    assert ledger is not None
    allowed = {name.lower() for name in settings.allowed_providers}

    this_attempt: set[str] = set()

    async def started(generation_id: str) -> None:
        this_attempt.add(generation_id)
        run.live_ids.add(generation_id)
        await ledger.started(prompt["id"], generation_id, settings.fingerprint)

    attempt = failed_attempts = throttled = 0
    while True:
        attempt += 1
        began = time.monotonic()
        request = run.request_fields()  # per attempt: the breaker may have dropped a provider meanwhile
        body = {"messages": prompt["messages"], **request}
        if prompt.get("tools"):
            body["tools"] = prompt["tools"]
        try:
            with anyio.fail_after(settings.request_timeout_s):
                if settings.stream:
                    reply = await read_streamed_reply(route, body, on_started=started)
                else:
                    reply = await read_reply(route, body, on_started=started)
            if allowed and str(reply.get("provider") or "").lower() not in allowed:
                await _bill(ledger, prompt["id"], reply, outcome="discarded")
                raise RequestFailed(
                    None,
                    f"served by {reply.get('provider')!r}, outside the allowlist: discarded",
                    provider=reply.get("provider"),
                    error_class="wrong_provider",
                )
        except RequestFailed as failed:
            failure = failed
        except httpx.HTTPError as error:
            failure = RequestFailed(None, f"{type(error).__name__} {one_line(str(error))}".strip())
        except TimeoutError:
            failure = RequestFailed(
                None, f"no complete answer within {settings.request_timeout_s:g} s", error_class="timeout"
            )
        else:
            record = {
                "prompt_id": prompt["id"],
                "fingerprint": settings.fingerprint,
                "request": request,
                **reply,
                "latency_s": round(time.monotonic() - began, 3),
                "attempts": attempt,
            }
            await journal.append(record)
            await _bill(ledger, prompt["id"], reply, outcome="kept", journaled=True)
            run.count_done(record, resumed=False)
            await run.check_usable(prompt, record)
            return
        finally:  # from here on an unpriced request counts in the ledger's reserve, not the forecast
            run.live_ids.difference_update(this_attempt)
            this_attempt.clear()
        await _close_failed(ledger, prompt["id"], failure)
        judged = verdict(failure)
        run.count_error(failure, judged)
        if failure.error_class == "wrong_provider":
            run.discarded(str(failure.provider))
        elif failure.provider_name or (failure.error_class == "error_in_200" and failure.status is None):
            run.strike(failure.provider_name or failure.provider or "(unnamed)", failure.error_class)
        if judged.action == "stop":
            run.stop(judged.ended_because, f"{failure} (prompt {prompt['id']}): {judged.advice}")
            return
        if judged.action == "throttle":
            throttled += 1
        else:
            failed_attempts += 1
        if judged.action == "fail" and failed_attempts >= (judged.attempts or 1):
            run.count_failure(prompt["id"], failure, attempt, permanent=True)
            return
        if failed_attempts >= settings.max_attempts or throttled >= MAX_THROTTLED_RETRIES:
            run.count_failure(prompt["id"], failure, attempt, permanent=False)
            return
        run.summary.retries += 1
        with anyio.move_on_after(_backoff_s(attempt, failure, settings)):
            await run.stopping.wait()
        if run.stop_reason is not None:
            return


async def _bill(
    ledger: RunLedger, prompt_id: str, reply: dict[str, Any], *, outcome: str, journaled: bool = False
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
    )


async def _close_failed(ledger: RunLedger, prompt_id: str, failure: RequestFailed) -> None:
    """A failure that carried a cost is charged. One that answered (HTTP error or an error in the body)
    closes its `started` line at zero; a cut connection leaves it open for `/generation` to settle."""
    answered = failure.status is not None or failure.error_class in {"error_in_200", "empty"}
    if failure.generation_id and (answered or failure.cost):
        await ledger.billed(
            prompt_id,
            failure.generation_id,
            usd=failure.cost or 0.0,
            outcome="error",
            provider=failure.provider,
        )


def _backoff_s(attempt: int, failure: RequestFailed, settings: GenerationSettings) -> float:
    """The server's Retry-After when it gives one, else exponential; jitter keeps workers that failed
    together from retrying together. Capped: a longer wait is better spent by a rerun."""
    if failure.retry_after_s is not None:
        delay = failure.retry_after_s + random.uniform(0, settings.backoff_base_s)
    else:
        exponential = settings.backoff_base_s * 2 ** (attempt - 1)
        delay = random.uniform(exponential / 2, exponential)
    return min(delay, settings.backoff_max_s) if math.isfinite(delay) else settings.backoff_max_s
