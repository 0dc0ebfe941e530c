"""Asking the API what it charged: `GET /key` (credit left, usage), `GET /generation?id=` (one request)
and `GET /generation/content?id=` (its stored text, where the account keeps it).

All are best-effort helpers of the accounts: a server without them (vLLM, SGLang) answers 404 and the
run goes on without the check. They fail like any route (429, 5xx): a failing `/key` is an unknown
state, never a stop; a failing `/generation` is asked again with back-off, within the lookup's wait.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, TypedDict

import anyio
import httpx

log = logging.getLogger(__name__)

LOOKUP_CONCURRENCY = 32
LOOKUP_RETRY_S = 1.0
# A lookup that meets 429 or 5xx is retried with back-off for at least this long, even at a start that
# does not wait for `/generation` to learn of a request: the answer exists, the route is only busy.
ERROR_RETRY_S = 10.0
LOOKUP_BACKOFF_FIRST_S = 0.5
LOOKUP_BACKOFF_MAX_S = 2.0


class PricedGeneration(TypedDict):
    """What the ledger and a rebuilt answer take from a `/generation` record (GenerationRecord)."""

    usd: float
    completion_tokens: int | None
    prompt_tokens: int | None
    reasoning_tokens: int
    provider: str | None
    finish_reason: str | None


@dataclass(frozen=True)
class KeyState:
    usage: float | None
    limit_remaining: float | None


async def check_key(http: httpx.AsyncClient) -> KeyState | None:
    """The key's usage and remaining limit, or None when the server has no `/key` or it failed this time."""
    try:
        response = await http.get("key")
        data = response.json()["data"] if response.status_code == 200 else None
    except (httpx.HTTPError, ValueError, KeyError, TypeError):
        log.warning("GET /key failed: the key's usage is unknown this time")
        return None
    if response.status_code == 429 or response.status_code >= 500:
        log.warning("GET /key answered %d: the key's usage is unknown this time", response.status_code)
    if not isinstance(data, dict):
        return None
    return KeyState(_number(data.get("usage")), _number(data.get("limit_remaining")))


async def recover_generations(
    http: httpx.AsyncClient, generation_ids: list[str], *, wait_s: float
) -> dict[str, PricedGeneration]:
    """{id: its priced record} for the ids `/generation` knows within `wait_s`."""
    found: dict[str, PricedGeneration] = {}
    limiter = anyio.CapacityLimiter(LOOKUP_CONCURRENCY)

    async def look_up(generation_id: str) -> None:
        data = await _lookup(http, "generation", generation_id, wait_s, limiter)
        if data is not None:
            found[generation_id] = _priced(data)

    async with anyio.create_task_group() as lookups:
        for generation_id in generation_ids:
            lookups.start_soon(look_up, generation_id)
    return found


async def generation_contents(
    http: httpx.AsyncClient, generation_ids: list[str]
) -> dict[str, dict[str, Any]]:
    """{id: GenerationContentData} for the ids whose text the account stored; asked once `/generation`
    knows them, so a 404 here means nothing is stored and is not waited on."""
    found: dict[str, dict[str, Any]] = {}
    limiter = anyio.CapacityLimiter(LOOKUP_CONCURRENCY)

    async def look_up(generation_id: str) -> None:
        data = await _lookup(http, "generation/content", generation_id, 0.0, limiter)
        if data is not None:
            found[generation_id] = data

    async with anyio.create_task_group() as lookups:
        for generation_id in generation_ids:
            lookups.start_soon(look_up, generation_id)
    return found


async def _lookup(
    http: httpx.AsyncClient, path: str, generation_id: str, wait_s: float, limiter: anyio.CapacityLimiter
) -> dict[str, Any] | None:
    """`data` of `GET path?id=`. A 404 (not known yet) is asked again every LOOKUP_RETRY_S within
    `wait_s`; 429, 5xx and broken connections with doubling waits (Retry-After when given) within
    max(`wait_s`, ERROR_RETRY_S); anything else ends the lookup."""
    now = anyio.current_time()
    unknown_until, failing_until = now + wait_s, now + max(wait_s, ERROR_RETRY_S)
    backoff_s = LOOKUP_BACKOFF_FIRST_S
    while True:
        async with limiter:
            status, data, retry_after_s = await _get(http, path, generation_id)
        if data is not None:
            return data
        if status == 404:
            delay_s, until = LOOKUP_RETRY_S, unknown_until
        elif status is None or status == 429 or status >= 500:
            delay_s, until = retry_after_s or backoff_s, failing_until
            backoff_s = min(2 * backoff_s, LOOKUP_BACKOFF_MAX_S)
        else:
            return None
        if anyio.current_time() + delay_s > until:
            if status != 404:
                log.warning(
                    "GET /%s for %s kept failing (%s): left for a later lookup",
                    path,
                    generation_id,
                    status or "no answer",
                )
            return None
        await anyio.sleep(delay_s)


async def _get(
    http: httpx.AsyncClient, path: str, generation_id: str
) -> tuple[int | None, dict[str, Any] | None, float | None]:
    """(status or None for no answer, `data` of a 200, Retry-After seconds)."""
    try:
        response = await http.get(path, params={"id": generation_id})
    except httpx.HTTPError:
        return None, None, None
    try:
        data = response.json().get("data") if response.status_code == 200 else None
    except (ValueError, AttributeError):
        data = None
    try:
        retry_after_s: float | None = float(response.headers.get("retry-after", ""))
    except ValueError:
        retry_after_s = None
    if response.status_code == 200 and not isinstance(data, dict):
        return None, None, retry_after_s  # a broken 200 is asked again like a lost answer
    return response.status_code, data if isinstance(data, dict) else None, retry_after_s


def _priced(data: dict[str, Any]) -> PricedGeneration:
    """`data` is the record as the server sent it, unchecked (a GenerationRecord, where it is OpenRouter)."""
    usd = _number(data.get("total_cost"))
    return {
        "usd": usd if usd is not None else _number(data.get("usage")) or 0.0,
        "completion_tokens": data.get("native_tokens_completion") or data.get("tokens_completion"),
        "prompt_tokens": data.get("native_tokens_prompt") or data.get("tokens_prompt"),
        "reasoning_tokens": data.get("native_tokens_reasoning") or 0,
        "provider": data.get("provider_name"),
        "finish_reason": data.get("finish_reason"),
    }


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None
