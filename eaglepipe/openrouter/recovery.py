"""Asking the API what it charged: `GET /key` (credit left, usage) and `GET /generation?id=` (one request).

Both are best-effort helpers of the accounts: a server without them (vLLM, SGLang) answers 404 and the
run goes on without the check.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import anyio
import httpx

log = logging.getLogger(__name__)

LOOKUP_CONCURRENCY = 32
LOOKUP_RETRY_S = 1.0


@dataclass(frozen=True)
class KeyState:
    usage: float | None
    limit_remaining: float | None


async def check_key(http: httpx.AsyncClient) -> KeyState | None:
    """The key's usage and remaining limit, or None when the server has no `/key`."""
    try:
        response = await http.get("key")
        data = response.json()["data"] if response.status_code == 200 else None
    except (httpx.HTTPError, ValueError, KeyError, TypeError):
        data = None
    if not isinstance(data, dict):
        return None
    return KeyState(_number(data.get("usage")), _number(data.get("limit_remaining")))


async def recover_generations(
    http: httpx.AsyncClient, generation_ids: list[str], *, wait_s: float
) -> dict[str, dict[str, Any]]:
    """{id: {usd, completion_tokens, provider}} for the ids `/generation` knows within `wait_s`."""
    found: dict[str, dict[str, Any]] = {}
    limiter = anyio.CapacityLimiter(LOOKUP_CONCURRENCY)
    deadline = anyio.current_time() + wait_s

    async def look_up(generation_id: str) -> None:
        while True:
            async with limiter:
                generation = await _generation(http, generation_id)
            if generation is not None:
                found[generation_id] = generation
                return
            if anyio.current_time() + LOOKUP_RETRY_S > deadline:
                return
            await anyio.sleep(LOOKUP_RETRY_S)

    async with anyio.create_task_group() as lookups:
        for generation_id in generation_ids:
            lookups.start_soon(look_up, generation_id)
    return found


async def _generation(http: httpx.AsyncClient, generation_id: str) -> dict[str, Any] | None:
    try:
        response = await http.get("generation", params={"id": generation_id})
        data = response.json().get("data") if response.status_code == 200 else None
    except (httpx.HTTPError, ValueError, AttributeError):
        return None
    if not isinstance(data, dict):
        return None
    usd = _number(data.get("total_cost"))
    return {
        "usd": usd if usd is not None else _number(data.get("usage")) or 0.0,
        "completion_tokens": data.get("native_tokens_completion") or data.get("tokens_completion"),
        "provider": data.get("provider_name"),
    }


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None
