"""Sending a prompt set to an OpenRouter-compatible API, each finished prompt journaled before it counts.

A fixed pool of `concurrency` workers reads prompts from a bounded stream; the feeder admits a prompt
only when the live concurrency has room, the run is not stopping and the budgets allow it (see
`admission.py`). Once a second a housekeeping tick re-reads the run-wide ledger, beats this job's heartbeat,
splits the run's concurrency among the jobs running now, adapts it to 429s and redraws the progress line.
Each failure is named and judged by the taxonomy (`taxonomy.py`, one table of every shape the API and its
providers fail in): transient ones are retried, throttles are waited out as told and lower the live
concurrency (a closed rate-limit window holds every new request), permanent ones are recorded, provider
evidence goes to the breaker, and credit, key and budget limits stop new requests while those in flight
finish, so everything paid for is kept and a rerun resumes. What was done and spent is tallied in
`accounting.py`; providers whose answers cannot be used are dropped by `breaker.py`.
"""

from __future__ import annotations

import contextlib
import logging
import math
import random
import resource
import ssl
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol, TypedDict

import anyio
import anyio.to_thread
import certifi
import httpx
from anyio.streams.memory import MemoryObjectReceiveStream

from eaglepipe.chat_api import ChatRequestBody, ChatRequestFields
from eaglepipe.openrouter.accounting import Tally, bill, close_failed
from eaglepipe.openrouter.admission import Admission
from eaglepipe.openrouter.admission import prompt_tokens_bound as prompt_tokens_bound
from eaglepipe.openrouter.answer_transport import ChatRoute, answer_transport
from eaglepipe.openrouter.appendlog import AppendLog
from eaglepipe.openrouter.billing_api import (
    KeyState,
    PricedGeneration,
    check_key,
    generation_contents,
    recover_generations,
)
from eaglepipe.openrouter.breaker import ProviderBreaker, ProviderHealth
from eaglepipe.openrouter.budget import REFIT_EVERY_S
from eaglepipe.openrouter.console import ProgressLine, ProviderRow, provider_table
from eaglepipe.openrouter.dollars import DollarBudgetParam
from eaglepipe.openrouter.errors import one_line
from eaglepipe.openrouter.journal import (
    FailureRecord,
    failed_for_good,
    open_failures,
    open_journal,
    read_records,
    reusable,
)
from eaglepipe.openrouter.ledger import Heartbeat, RunLedger, StartedLine
from eaglepipe.openrouter.rebuilt_answers import rebuilt_answer
from eaglepipe.openrouter.replies import RequestFailed, read_reply, read_streamed_reply
from eaglepipe.openrouter.secrets import ApiKey
from eaglepipe.openrouter.settings import GenerationSettings
from eaglepipe.openrouter.taxonomy import Observed
from eaglepipe.progress import eta_seconds, format_eta
from eaglepipe.prompts.records import PromptRecord
from eaglepipe.responses import ResponseRecord

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
# A throttle's wait is honoured in full up to this; a longer one (a daily limit) stops the run resumable.
THROTTLE_MAX_WAIT_S = 900.0


class UsabilityProbe(Protocol):
    def __call__(self, prompt: PromptRecord, record: ResponseRecord) -> str | None:
        """Why the journaled answer `record` to `prompt` cannot be trained on, or None."""
        ...


class FailureEntry(TypedDict):
    """A prompt that failed, as the summary's `failures` lists it (`status`: the HTTP status, if any)."""

    prompt_id: str
    status: int | None
    error: str
    attempts: int
    permanent: bool


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
    providers: dict[str, ProviderRow] = field(default_factory=dict)
    # The circuit breaker: providers dropped (and why), strikes by provider, discards by foreign provider.
    breaker: dict[str, Any] = field(default_factory=dict)
    probed: dict[str, int] = field(default_factory=dict)
    failures: list[FailureEntry] = field(default_factory=list)
    emulated: bool = False
    max_tokens: int = 0
    # The dollars the set ran under (eaglepipe/openrouter/dollars.py reads it back), and `partial` is
    # `dollar_budget` when its share of budget.usd ended it: complete for now, the rest bought on a raise.
    dollar_budget: DollarBudgetParam | None = None
    partial: str | None = None
    # What else of the rule's params the set ran under, so a rerun for them is known from this file.
    fingerprint: str = ""
    output_token_budget: int | None = None

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
    prompts: list[PromptRecord],
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
    run.tally.done_ids.update(earlier)
    heartbeat = Heartbeat(ledger_dir, dataset)
    async with contextlib.AsyncExitStack() as stack:
        routes = _http_pools(settings, api_key)
        for route in routes:
            await stack.enter_async_context(route.http)
        journal = await stack.enter_async_context(open_journal(journal_dir))
        run.failed_log = await stack.enter_async_context(open_failures(journal_dir))
        ledger = await stack.enter_async_context(RunLedger(ledger_dir, dataset))
        http = routes[0].http  # also for /key and /generation
        run.ledger, run.http, run.journal = ledger, http, journal
        # Settled before the prompts are counted: an answer an earlier run lost, journaled now from
        # `/generation/content`, is resumed rather than bought again.
        recovered = await _settle_earlier_runs(run, journaled)
        failed = {} if settings.retry_failed else failed_for_good(journal_dir, settings.fingerprint)
        todo = run.resume(prompts, {**earlier, **reusable(recovered, settings.fingerprint)}, failed)
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
        key = await check_key(http) if settings.paid else None
        run.summary.key_usage_end = key.usage if key else None
    run.finish()
    if settings.progress:
        run.progress.close(run.progress_line())
    log.info("%s: generation ended (%s): %s", dataset, run.summary.ended_because, run.progress_line())
    if run.tally.provider_stats:
        log.info(
            "%s: per provider%s (trunc: answers cut at max_tokens %d)\n%s",
            dataset,
            " (emulated: simulated providers and prices)" if settings.emulated else "",
            settings.max_tokens,
            provider_table(run.tally.provider_stats),
        )
    return run.summary


class _Run:
    """State shared by the feeder, the workers and the housekeeping tick (one event loop: no locks): what
    may start (`admission`), what was done and spent (`tally`) and which providers are still used
    (`health`), plus the stopping and the wake-ups that tie them together."""

    def __init__(
        self,
        settings: GenerationSettings,
        summary: GenerationSummary,
        dataset: str,
        probe: UsabilityProbe | None = None,
    ) -> None:
        self.settings = settings
        self.summary = summary
        self.dataset = dataset
        self.ledger: RunLedger | None = None
        self.http: httpx.AsyncClient | None = None
        self.journal: AppendLog | None = None
        self.failed_log: AppendLog | None = None
        self.prompts: dict[str, PromptRecord] = {}
        self.admission = Admission(
            dataset=dataset,
            concurrency=settings.concurrency,
            max_tokens=settings.max_tokens,
            expected_request_usd=settings.expected_request_usd,
            prompt_usd_per_token=settings.prompt_usd_per_token,
            output_token_budget=settings.output_token_budget,
            dollar_budget=settings.dollar_budget,
        )
        self.tally = Tally(summary, settings.max_tokens, self.admission.forecast)
        self.health = ProviderHealth(
            ProviderBreaker(settings.breaker_strikes, settings.breaker_share),
            dataset=dataset,
            allowed_providers=settings.allowed_providers,
            probe=probe,
            probe_answers=settings.probe_answers,
            stop=self.stop,
        )
        self.changed = anyio.Event()
        self.stopping = anyio.Event()
        self.stop_reason: str | None = None
        self.progress = ProgressLine()
        self.started = time.monotonic()
        # Why each of this job's failed requests failed (the taxonomy's class), by generation id: one cut
        # off and billed later is booked under its cause.
        self.cut_causes: dict[str, str] = {}
        self.todo_at_start = 0

    def resume(
        self,
        prompts: list[PromptRecord],
        reusable: dict[str, ResponseRecord],
        failed: dict[str, FailureRecord],
    ) -> list[PromptRecord]:
        todo = self.tally.resume(prompts, reusable, failed)
        self.todo_at_start = len(todo)
        self.notify()
        return todo

    def count_done(self, record: ResponseRecord, *, resumed: bool) -> None:
        self.tally.count_done(record, resumed=resumed)
        self.notify()

    def count_recovered(self, record: ResponseRecord) -> None:
        self.tally.count_recovered(record)
        self.notify()

    def count_error(self, failure: RequestFailed) -> None:
        self.tally.count_error(failure)
        self.admission.record_attempt(rate_limited=failure.shape.verdict == "throttle")

    def request_fields(self) -> ChatRequestFields:
        return self.settings.shared_request_fields(self.health.dropped())

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

    def size_first_wave(self, key: KeyState | None, todo: list[PromptRecord]) -> None:
        self.admission.size_first_wave(key, todo)
        if self.admission.first_wave is not None:
            self.summary.first_wave = self.admission.first_wave

    async def admit(self, prompt_id: str) -> bool:
        """Wait until one more request may go out; False once the run stops admitting."""
        while self.stop_reason is None:
            verdict = self.admission.try_start(prompt_id, self.summary.completion_tokens, self.ledger)
            if verdict is None:
                return True
            if verdict[0] != "wait":
                self.stop(*verdict)
                break
            # Nothing runs between the check above and this wait, so no wake-up is missed.
            self.changed = anyio.Event()
            await self.changed.wait()
        return False

    def finished(self, prompt_id: str) -> None:
        """A worker is done with `prompt_id`, however it ended: its slot is free again."""
        self.admission.finish(prompt_id)
        self.notify()

    def finish(self) -> None:
        """Permanent failures (400/403) are final answers; transient ones leave the set unfinished for a
        rerun to retry, unless `max_failed_fraction` of the set may stay unanswered."""
        summary = self.summary
        self.tally.close(self.ledger, self.dataset)
        summary.concurrency_lowest = self.admission.limit.lowest
        summary.concurrency_cuts = self.admission.limit.cuts
        summary.breaker = self.health.report()
        summary.probed = dict(self.health.probed)
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
        admission, tally = self.admission, self.tally
        elapsed = max(time.monotonic() - self.started, 1e-9)
        summary, new = self.summary, self.summary.done - self.summary.resumed
        left = summary.requested - summary.done - summary.failed_permanent - summary.failed_transient
        # The first wave's answers finish together, late: an ETA from its first few would only climb. Its
        # size is this job's live limit (the run's concurrency split among the jobs running, or a first
        # wave the key's credit holds), not the configured concurrency.
        first_wave = min(admission.limit.current, self.todo_at_start)
        answers_before_eta = max(1, first_wave // 2)
        eta = eta_seconds(elapsed, new, left, minimum=answers_before_eta)
        spent = self.ledger.view.usd if self.ledger else tally.dollars_this_run
        projected = spent + left * admission.forecast.mean_usd
        errors = " ".join(f"{name}={count}" for name, count in sorted(tally.errors.items())) or "none"
        # What OpenRouter holds against the balance for the requests in flight (its in-flight budget).
        reserved = admission.in_flight * self.settings.expected_request_usd
        note = admission.first_wave_note
        held = admission.held_s()
        if held:
            note = f"new requests held {held:.0f}s by a rate-limit window" + (f", {note}" if note else "")
        if self.settings.paid:
            dollars = f"${spent:.2f} spent by the run (projected ${projected:.2f}), "
            in_flight = f"(limit {admission.limit.current}, ${reserved:.2f} reserved at worst case)"
        else:
            dollars, in_flight = "", f"(limit {admission.limit.current})"
        return (
            f"{self.dataset}: {summary.done}/{summary.requested} done, "
            f"{tally.tokens_this_run / elapsed:.0f} tok/s, {dollars}{admission.in_flight} in flight "
            f"{in_flight}, errors {errors}, ETA {format_eta(eta)}"
            + ("" if eta is not None else f" until {answers_before_eta} answers")
            + (f", {note}" if note else "")
        )


async def _tick_forever(run: _Run, heartbeat: Heartbeat) -> None:
    last_log = last_key_check = time.monotonic()
    admission = run.admission
    while True:
        await anyio.sleep(TICK_S)
        admission.forecast.refresh(max_age_s=REFIT_EVERY_S)  # admissions may have refit it just now
        await anyio.to_thread.run_sync(heartbeat.beat, admission.in_flight, admission.forecast.in_flight_usd)
        admission.tick(heartbeat.others())
        run.notify()
        now = time.monotonic()
        if run.settings.progress:
            run.progress.show(run.progress_line())
        if now - last_log >= LOG_PROGRESS_EVERY_S:
            last_log = now
            log.info("%s", run.progress_line())
        if now - last_key_check >= KEY_CHECK_EVERY_S:
            last_key_check = now
            await _check_key(run)


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


async def _settle_earlier_runs(run: _Run, journaled: list[ResponseRecord]) -> list[ResponseRecord]:
    """Before spending: charge journaled answers a killed job never entered in the ledger, and look up
    requests it left in flight or cut off; returns the answers journaled from `/generation/content`."""
    assert run.ledger is not None
    view = run.ledger.view.refresh()
    for record in journaled:
        generation_id = record.get("generation_id")
        if generation_id and generation_id not in view.resolved:
            await bill(run.ledger, record["prompt_id"], record, outcome="kept")
            view.refresh()
    if view.refresh().unresolved_of(run.dataset):
        return await _recover(run, at_end=False)
    return []


async def _recover(run: _Run, *, at_end: bool) -> list[ResponseRecord]:
    """Charge requests of this set that were cut off, in flight at a kill or answered without a cost,
    per `/generation`. At the start only what `/generation` knows already; at the end, waiting up to
    `recovery_wait_s` (OpenRouter answers 404 for a while after a generation ends, minutes for long
    answers). One still unknown stays open, held at its worst case, for the next start to settle; it is
    closed at $0 (`not_found`) only once it is older than the longest answer can take plus a grace.
    A found one whose prompt has no answer yet is journaled from `/generation/content` where that holds
    the whole answer (`rebuilt_answers.py`); those records are returned, for the caller to count."""
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
            cause=run.cut_causes.get(record["generation_id"]),
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
    run: _Run, pending: list[StartedLine], found: dict[str, PricedGeneration]
) -> dict[str, ResponseRecord]:
    """{generation id: journal record} for found requests whose prompt (of this set, asked under this
    fingerprint) has no answer yet and whose stored content is the whole answer; one per prompt, the first
    of its cut attempts that qualifies."""
    assert run.http is not None
    settings = run.settings
    candidates: dict[str, list[StartedLine]] = {}
    for record in pending:
        prompt_id = record["prompt_id"]
        if (
            record["generation_id"] in found
            and record.get("fingerprint") == settings.fingerprint
            and prompt_id in run.prompts
            and prompt_id not in run.tally.done_ids
        ):
            candidates.setdefault(prompt_id, []).append(record)
    if not candidates:
        return {}
    contents = await generation_contents(
        run.http, [record["generation_id"] for attempts in candidates.values() for record in attempts]
    )
    allowed = frozenset(name.lower() for name in settings.allowed_providers)
    rebuilt: dict[str, ResponseRecord] = {}
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
    if not run.settings.paid:
        return None
    key = await check_key(run.http)
    if key is None:
        return None
    if run.summary.key_usage_start is None:
        run.summary.key_usage_start = key.usage
    if key.limit_remaining is not None and key.limit_remaining < run.admission.forecast.mean_usd:
        run.stop(
            "key_limit",
            f"the key's limit_remaining is ${key.limit_remaining:.4f}, less than one request: "
            "raise the key's limit (or wait until it resets), then rerun",
        )
    return key


async def _feed_workers(
    todo: list[PromptRecord], routes: list[ChatRoute], journal: AppendLog, run: _Run
) -> None:
    """Worker i sends through pool i mod n, so every pool carries an equal share of the requests."""
    settings = run.settings
    send, receive = anyio.create_memory_object_stream[PromptRecord](0)
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
    prompts: MemoryObjectReceiveStream[PromptRecord], route: ChatRoute, journal: AppendLog, run: _Run
) -> None:
    async with prompts:
        async for prompt in prompts:
            try:
                await _complete_prompt(prompt, route, journal, run)
            finally:
                run.finished(prompt["id"])


async def _complete_prompt(prompt: PromptRecord, route: ChatRoute, journal: AppendLog, run: _Run) -> None:
    """Try until done, failed for good, or the run is stopping (then the prompt stays to resume)."""
    settings, ledger = run.settings, run.ledger
    assert ledger is not None
    allowed = {name.lower() for name in settings.allowed_providers}

    this_attempt: set[str] = set()

    async def started(generation_id: str) -> None:
        this_attempt.add(generation_id)
        run.admission.live_ids.add(generation_id)
        if settings.paid:  # an unpaid request has nothing for `/generation` to settle after a kill
            await ledger.started(prompt["id"], generation_id, settings.fingerprint)

    attempt = failed_attempts = throttled = 0
    while True:
        attempt += 1
        began = time.monotonic()
        request = run.request_fields()  # per attempt: the breaker may have dropped a provider meanwhile
        body: ChatRequestBody = {"messages": prompt["messages"], **request}
        if tools := prompt.get("tools"):
            body["tools"] = tools
        try:
            with anyio.fail_after(settings.request_timeout_s):
                if settings.stream:
                    reply = await read_streamed_reply(route, body, on_started=started)
                else:
                    reply = await read_reply(route, body, on_started=started)
            if allowed and str(reply.get("provider") or "").lower() not in allowed:
                await bill(ledger, prompt["id"], reply, outcome="discarded", cause="foreign_provider")
                raise RequestFailed(
                    Observed.FOREIGN_PROVIDER,
                    f"served by {reply.get('provider')!r}, outside the allowlist: discarded",
                    provider=reply.get("provider"),
                )
        except RequestFailed as failed:
            failure = failed
        except httpx.HTTPError as error:
            detail = f"{type(error).__name__} {one_line(str(error))}".strip()
            failure = RequestFailed(Observed.NETWORK, detail)
        except TimeoutError:
            failure = RequestFailed(
                Observed.TIMEOUT, f"no complete answer within {settings.request_timeout_s:g} s"
            )
        else:
            if not settings.paid:
                reply["usage"] = {**(reply.get("usage") or {}), "cost": 0.0}
            record: ResponseRecord = {
                "prompt_id": prompt["id"],
                "source": settings.source.value,
                "fingerprint": settings.fingerprint,
                "request": request,
                **reply,
                "generation_id": reply.get("generation_id"),
                "provider": reply.get("provider") or settings.server_name,
                "latency_s": round(time.monotonic() - began, 3),
                "attempts": attempt,
            }
            await journal.append(record)
            await bill(ledger, prompt["id"], reply, outcome="kept", journaled=True)
            run.count_done(record, resumed=False)
            await run.health.check_usable(prompt, record)
            return
        finally:  # from here on an unpriced request counts in the ledger's reserve, not the forecast
            run.admission.live_ids.difference_update(this_attempt)
            attempt_ids = set(this_attempt)
            this_attempt.clear()
        await close_failed(ledger, prompt["id"], failure)
        for generation_id in attempt_ids:  # a cut one is priced by `/generation` later, under this cause
            run.cut_causes[generation_id] = failure.error_class
        shape = failure.shape
        run.count_error(failure)
        run.health.judge(failure)
        if shape.verdict == "run_stop":
            run.stop(shape.ended_because, f"{failure} (prompt {prompt['id']}): {shape.advice}")
            return
        wait_s = _wait_s(attempt, failure, settings)
        if shape.verdict == "throttle":
            throttled += 1
            if wait_s > THROTTLE_MAX_WAIT_S:
                run.stop("rate_limited", _long_wait_message(failure, wait_s, prompt["id"]))
                return
            if failure.wait is not None and failure.wait.window:
                run.admission.hold_for(wait_s)  # the window is closed for every request, not just this one
        else:
            failed_attempts += 1
        if shape.verdict == "prompt_permanent" or (shape.attempts and failed_attempts >= shape.attempts):
            run.tally.count_failure(prompt["id"], failure, attempt, permanent=True)
            assert run.failed_log is not None
            for_good: FailureRecord = {
                "prompt_id": prompt["id"],
                "fingerprint": settings.fingerprint,
                "class": failure.error_class,
                "status": failure.status,
                "error": failure.detail,
            }
            await run.failed_log.append(for_good)  # durable: a rerun skips it unless generation.retry_failed
            return
        if failed_attempts >= settings.max_attempts or throttled >= MAX_THROTTLED_RETRIES:
            run.tally.count_failure(prompt["id"], failure, attempt, permanent=False)
            return
        run.summary.retries += 1
        with anyio.move_on_after(wait_s):
            await run.stopping.wait()
        if run.stop_reason is not None:
            return


def _wait_s(attempt: int, failure: RequestFailed, settings: GenerationSettings) -> float:
    """The longest wait the server gave (plus jitter, so workers told the same wait do not retry
    together), else exponential backoff. A transient failure's wait is capped at `backoff_max_s` (a longer
    one is better spent by a rerun); a throttle's is not: retrying into a closed window buys nothing, and a
    wait past THROTTLE_MAX_WAIT_S stops the run instead."""
    jitter = random.uniform(0, settings.backoff_base_s)
    if failure.wait is not None and failure.shape.verdict == "throttle":
        return failure.wait.seconds + jitter
    if failure.wait is not None:
        return min(failure.wait.seconds + jitter, settings.backoff_max_s)
    # Capped before the jitter: a retry every exactly backoff_max_s keeps landing in the same phase of a
    # periodic limit (a per-minute window), so a prompt could meet the same closed window forever.
    exponential = min(settings.backoff_base_s * 2 ** min(attempt - 1, 30), settings.backoff_max_s)
    return random.uniform(exponential / 2, exponential)


def _long_wait_message(failure: RequestFailed, wait_s: float, prompt_id: str) -> str:
    assert failure.wait is not None
    at = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(time.time() + wait_s))
    return (
        f"{failure} (prompt {prompt_id}): told to wait {wait_s / 60:.0f} min ({failure.wait.source}), "
        f"longer than a run waits ({THROTTLE_MAX_WAIT_S / 60:.0f} min): rerun after {at}"
    )
