"""Sending a prompt set to an OpenRouter-compatible API, each finished prompt journaled before it counts.

A fixed pool of `concurrency` workers reads prompts from a bounded stream; the feeder admits a prompt
only when a slot is free, the run is not stopping and the token budget allows it. Failures are sorted
by what helps: transient ones are retried, permanent ones recorded, and 401/402/404 stop new requests
while those in flight finish, so everything paid for is kept and a rerun resumes.
"""

from __future__ import annotations

import logging
import random
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import anyio
import httpx
from anyio.streams.memory import MemoryObjectReceiveStream

from eaglepipe.openrouter.errors import OpenRouterError, one_line
from eaglepipe.openrouter.journal import Journal, load_done
from eaglepipe.openrouter.replies import RequestFailed, read_reply, read_streamed_reply
from eaglepipe.openrouter.secrets import ApiKey

log = logging.getLogger(__name__)

# What each run-stopping status means for the user, as (ended_because, what to do).
STOPPING_STATUSES = {
    401: ("unauthorized", "check the API key file"),
    402: ("credit_exhausted", "add credits or raise the key's limit"),
    404: ("no_endpoint", "check model and base_url, or relax `routing` and refresh providers.json"),
}
# Measured at 500 in flight: 500 idle keep-alive connections cost httpx ~5x the CPU per response of 100.
MAX_KEEPALIVE_CONNECTIONS = 100
PROGRESS_INTERVAL_S = 5.0


@dataclass(frozen=True)
class GenerationSettings:
    """One prompt set's request shape and run limits. `fingerprint` is computed by the caller from the
    configured server identity (see `request_fingerprint`), since `base_url` may carry a per-run port.
    `output_token_budget` caps the set's completion tokens, resumed ones included, so a plain rerun of a
    set stopped by its budget does not spend a second budget."""

    base_url: str
    model: str
    fingerprint: str
    max_tokens: int
    sampling: dict[str, Any] = field(default_factory=dict)
    provider_obj: dict[str, Any] | None = None
    reasoning: dict[str, Any] | None = None
    concurrency: int = 16
    max_attempts: int = 5
    request_timeout_s: float = 600.0
    output_token_budget: int | None = None
    # Run-wide dollars: the cap, what the run had spent before this job, and what one request is expected
    # to cost until this job has observed some (an upper bound from prices and max_tokens).
    usd_budget: float | None = None
    usd_spent_before: float = 0.0
    expected_request_usd: float = 0.0
    stream: bool = False
    return_token_ids: bool = False
    backoff_base_s: float = 1.0
    backoff_max_s: float = 60.0

    def __post_init__(self) -> None:
        for name in ("max_tokens", "concurrency", "max_attempts"):
            if getattr(self, name) < 1:
                raise OpenRouterError(
                    f"generation setting {name} = {getattr(self, name)}: must be at least 1"
                )
        if self.request_timeout_s <= 0:
            raise OpenRouterError(
                f"generation setting request_timeout_s = {self.request_timeout_s}: must be > 0"
            )

    def shared_request_fields(self) -> dict[str, Any]:
        """The request body minus the prompt: also what each record keeps as its `request`."""
        fields: dict[str, Any] = {"model": self.model, "max_tokens": self.max_tokens}
        fields.update({key: value for key, value in self.sampling.items() if value is not None})
        if self.provider_obj is not None:
            fields["provider"] = self.provider_obj
        if self.reasoning is not None:
            fields["reasoning"] = self.reasoning
        fields["usage"] = {"include": True}
        fields["stream"] = self.stream
        if self.return_token_ids:
            fields["return_token_ids"] = True
        return fields


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
    failures: list[dict[str, Any]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


async def generate_set(
    prompts: list[dict[str, Any]], *, settings: GenerationSettings, api_key: ApiKey | None, journal_dir: Path
) -> GenerationSummary:
    """Generate every prompt not yet journaled under `settings.fingerprint`; never raises for failed
    requests (the summary says what happened), only for unusable input."""
    run = _Run(settings, GenerationSummary(requested=len(prompts)))
    reusable = load_done(journal_dir, settings.fingerprint)
    todo = []
    seen: set[str] = set()
    for prompt in prompts:
        if prompt["id"] in seen:
            raise OpenRouterError(
                f"prompt id {prompt['id']} appears twice in the set: rebuild the prompt set"
            )
        seen.add(prompt["id"])
        if prompt["id"] in reusable:
            run.count_done(reusable[prompt["id"]], resumed=True)
        else:
            todo.append(prompt)
    log.info(
        "generating %d of %d prompts (%d resumed), fingerprint %s, concurrency %d",
        len(todo),
        len(prompts),
        run.summary.resumed,
        settings.fingerprint,
        settings.concurrency,
    )
    async with (
        _http_client(settings, api_key) as http,
        Journal(journal_dir) as journal,
        anyio.create_task_group() as progress,
    ):
        progress.start_soon(_log_progress, run)
        await _feed_workers(todo, http, journal, run)
        progress.cancel_scope.cancel()
    run.finish()
    log.info("generation ended (%s): %s", run.summary.ended_because, run.progress_line())
    return run.summary


class _Run:
    """Counters shared by the feeder, the workers and the progress log (one event loop: no locks)."""

    def __init__(self, settings: GenerationSettings, summary: GenerationSummary) -> None:
        self.settings = settings
        self.summary = summary
        self.slots = anyio.Semaphore(settings.concurrency)
        self.stopping = anyio.Event()
        self.stop_reason: str | None = None
        self.in_flight = 0
        self.tokens_this_run = 0
        self.dollars_this_run = 0.0
        self.started = time.monotonic()

    def count_done(self, record: dict[str, Any], *, resumed: bool) -> None:
        usage = record.get("usage") or {}
        # Unknown usage (a server that reports none) counts as max_tokens: the budget stays an upper bound.
        tokens = usage.get("completion_tokens")
        tokens = self.settings.max_tokens if tokens is None else tokens
        cost = usage.get("cost") or 0.0
        self.summary.done += 1
        self.summary.completion_tokens += tokens
        self.summary.dollars += cost
        self.summary.truncated += record["response"]["finish_reason"] == "length"
        if resumed:
            self.summary.resumed += 1
        else:
            self.tokens_this_run += tokens
            self.dollars_this_run += cost

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
            log.warning("stopping new requests: %s", message)

    def budget_reached(self) -> bool:
        """Done tokens plus what the requests in flight are expected to produce (max_tokens until responses
        are seen, then their mean) have reached the budget."""
        budget = self.settings.output_token_budget
        if budget is None:
            return False
        done = self.summary.done
        expected = self.summary.completion_tokens / done if done else self.settings.max_tokens
        return self.summary.completion_tokens + self.in_flight * expected >= budget

    def dollars_reached(self) -> bool:
        """The run's spend plus what the requests in flight and the next one are expected to cost (their
        observed mean, else the configured upper bound) would pass `usd_budget`."""
        budget = self.settings.usd_budget
        if budget is None:
            return False
        new = self.summary.done - self.summary.resumed
        expected = self.dollars_this_run / new if new else self.settings.expected_request_usd
        spent = self.settings.usd_spent_before + self.dollars_this_run
        return spent + (self.in_flight + 1) * expected > budget

    def finish(self) -> None:
        """Permanent failures (400/403) are final answers, recorded in the summary; transient ones leave
        the set unfinished, for a rerun to retry."""
        transient = [failure for failure in self.summary.failures if not failure["permanent"]]
        if self.stop_reason is not None:
            self.summary.ended_because = self.stop_reason
        elif transient:
            first = transient[0]
            self.summary.ended_because = "failures"
            self.summary.message = (
                f"{len(transient)} prompt(s) failed transiently, first {first['prompt_id']}: {first['error']}"
            )

    def progress_line(self) -> str:
        elapsed = max(time.monotonic() - self.started, 1e-9)
        return (
            f"{self.summary.done}/{self.summary.requested} done, {self.tokens_this_run / elapsed:.0f} tok/s, "
            f"${self.dollars_this_run:.4f} this run, {self.in_flight} in flight"
        )


async def _log_progress(run: _Run) -> None:
    while True:
        await anyio.sleep(PROGRESS_INTERVAL_S)
        log.info("%s", run.progress_line())


def _http_client(settings: GenerationSettings, api_key: ApiKey | None) -> httpx.AsyncClient:
    limits = httpx.Limits(
        max_connections=settings.concurrency,
        max_keepalive_connections=min(settings.concurrency, MAX_KEEPALIVE_CONNECTIONS),
    )
    return httpx.AsyncClient(
        base_url=settings.base_url,
        headers=api_key.authorization_header() if api_key else {},
        limits=limits,
        # Read = the longest gap between bytes; no pool timeout: admission already caps waiting requests.
        timeout=httpx.Timeout(settings.request_timeout_s, pool=None),
    )


async def _feed_workers(
    todo: list[dict[str, Any]], http: httpx.AsyncClient, journal: Journal, run: _Run
) -> None:
    settings = run.settings
    send, receive = anyio.create_memory_object_stream[dict[str, Any]](settings.concurrency)
    async with anyio.create_task_group() as workers:
        for _ in range(settings.concurrency):
            workers.start_soon(_worker, receive.clone(), http, journal, run)
        receive.close()
        async with send:
            for prompt in todo:
                await run.slots.acquire()
                if run.stop_reason is None and run.budget_reached():
                    run.stop(
                        "token_budget",
                        f"output_token_budget {settings.output_token_budget} reached "
                        f"({run.summary.completion_tokens} completion tokens done)",
                    )
                if run.stop_reason is None and run.dollars_reached():
                    run.stop(
                        "dollar_budget",
                        f"budget.usd {settings.usd_budget:g} reached "
                        f"(${settings.usd_spent_before + run.dollars_this_run:.4f} spent by the run): "
                        "raise budget.usd to go on",
                    )
                if run.stop_reason is not None:
                    run.slots.release()
                    break
                run.in_flight += 1
                await send.send(prompt)


async def _worker(
    prompts: MemoryObjectReceiveStream[dict[str, Any]], http: httpx.AsyncClient, journal: Journal, run: _Run
) -> None:
    async with prompts:
        async for prompt in prompts:
            try:
                await _complete_prompt(prompt, http, journal, run)
            finally:
                run.in_flight -= 1
                run.slots.release()


async def _complete_prompt(
    prompt: dict[str, Any], http: httpx.AsyncClient, journal: Journal, run: _Run
) -> None:
    """Try until done, failed for good, or the run is stopping (then the prompt stays to resume)."""
    settings = run.settings
    request = settings.shared_request_fields()
    body = {"messages": prompt["messages"], **request}
    if prompt.get("tools"):
        body["tools"] = prompt["tools"]
    for attempt in range(1, settings.max_attempts + 1):
        started = time.monotonic()
        try:
            with anyio.fail_after(settings.request_timeout_s):
                if settings.stream:
                    reply = await read_streamed_reply(http, body)
                else:
                    reply = await read_reply(http, body)
        except RequestFailed as failed:
            failure = failed
        except httpx.HTTPError as error:
            failure = RequestFailed(None, f"{type(error).__name__} {one_line(str(error))}".strip())
        except TimeoutError:
            failure = RequestFailed(None, f"no complete answer within {settings.request_timeout_s:g} s")
        else:
            record = {
                "prompt_id": prompt["id"],
                "fingerprint": settings.fingerprint,
                "request": request,
                **reply,
                "latency_s": round(time.monotonic() - started, 3),
                "attempts": attempt,
            }
            await journal.append(record)
            run.count_done(record, resumed=False)
            return
        if failure.status in STOPPING_STATUSES:
            reason, advice = STOPPING_STATUSES[failure.status]
            run.stop(reason, f"{failure} (prompt {prompt['id']}): {advice}")
            return
        if not failure.transient:
            run.count_failure(prompt["id"], failure, attempt, permanent=True)
            return
        if attempt == settings.max_attempts:
            run.count_failure(prompt["id"], failure, attempt, permanent=False)
            return
        run.summary.retries += 1
        with anyio.move_on_after(_backoff_s(attempt, failure, settings)):
            await run.stopping.wait()
        if run.stop_reason is not None:
            return


def _backoff_s(attempt: int, failure: RequestFailed, settings: GenerationSettings) -> float:
    """The server's Retry-After when it gives one, else exponential; jitter keeps workers that failed
    together from retrying together. Capped: a longer wait is better spent by a rerun."""
    if failure.retry_after_s is not None:
        delay = failure.retry_after_s + random.uniform(0, settings.backoff_base_s)
    else:
        exponential = settings.backoff_base_s * 2 ** (attempt - 1)
        delay = random.uniform(exponential / 2, exponential)
    return min(delay, settings.backoff_max_s)
