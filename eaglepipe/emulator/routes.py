"""The paths beside chat completions (app.py): the catalogue (`/models`, a model's endpoints), the
account's (`/key`, `/generation`, `/generation/content`, each behind the key and its accounting faults) and
the emulator's own (`GET /emulator/stats`, `POST /emulator/credit`), and the app that mounts them all.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from functools import partial
from typing import TYPE_CHECKING, Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from eaglepipe.emulator.errors import ApiError
from eaglepipe.emulator.faults import AccountRoute

if TYPE_CHECKING:
    from eaglepipe.emulator.app import Emulator


def error_response(exc: ApiError) -> JSONResponse:
    return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers())


def _model(emulator: Emulator) -> dict[str, Any]:
    routable = [e for e in emulator.endpoints if e.status == 0] or emulator.endpoints
    cheapest = min(routable, key=lambda e: e.price("prompt") + e.price("completion"))
    supported = sorted({p for e in emulator.endpoints for p in e.public["supported_parameters"]})
    return {
        "id": emulator.model_id,
        "canonical_slug": emulator.model_id,
        "name": emulator.model_id,
        "created": emulator.started_at,
        "description": "The local target model, served by the emulator.",
        "pricing": cheapest.public["pricing"],
        "context_length": emulator.context_length,
        "architecture": {
            "modality": "text->text",
            "input_modalities": ["text"],
            "output_modalities": ["text"],
            "tokenizer": "Other",
            "instruct_type": "chatml",
        },
        "top_provider": {
            "context_length": emulator.context_length,
            "max_completion_tokens": cheapest.public["max_completion_tokens"],
            "is_moderated": False,
        },
        "per_request_limits": None,
        "supported_parameters": supported,
        "default_parameters": None,
        "supported_voices": None,
        "hugging_face_id": None,
        "knowledge_cutoff": None,
        "expiration_date": None,
        "links": {"details": f"/api/v1/models/{emulator.model_id}/endpoints"},
        "reasoning": {"mandatory": False, "default_enabled": False, "supported_efforts": None},
    }


async def models(emulator: Emulator, request: Request) -> Response:
    return JSONResponse({"data": [_model(emulator)], "total_count": 1, "links": {"next": None}})


async def model_endpoints(emulator: Emulator, request: Request) -> Response:
    requested = f"{request.path_params['author']}/{request.path_params['slug']}"
    if requested != emulator.model_id:
        return error_response(
            ApiError(
                404,
                f"Model {requested!r} not found (this emulator serves {emulator.model_id!r})",
                "not_found",
            )
        )
    model = _model(emulator)
    data = {key: model[key] for key in ("id", "name", "created", "description", "architecture")}
    return JSONResponse({"data": {**data, "endpoints": [e.public for e in emulator.endpoints]}})


def _account_fault(emulator: Emulator, route: AccountRoute) -> None:
    """The fault source's error, if it has one, answers in place of an accounting route."""
    error = None if emulator.faults is None else emulator.faults.account(route, emulator.traffic)
    if error is not None:
        raise error


async def key(emulator: Emulator, request: Request) -> Response:
    try:
        emulator.authorize(request)
        _account_fault(emulator, "key")
    except ApiError as exc:
        return error_response(exc)
    return JSONResponse({"data": emulator.account.key_data()})


async def generation(emulator: Emulator, request: Request) -> Response:
    return _looked_up(emulator, request, emulator.account.generation, "Generation {id!r} not found")


async def generation_content(emulator: Emulator, request: Request) -> Response:
    """The stored prompt and answer text of a generation (`--store-content`), cut-off ones included."""
    return _looked_up(emulator, request, emulator.account.content, "No content for {id!r}")


def _looked_up(
    emulator: Emulator, request: Request, find: Callable[[str], Any | None], missing: str
) -> Response:
    """A generation's stored record by its `id` (both routes answer under /generation's faults), or 404."""
    try:
        emulator.authorize(request)
        _account_fault(emulator, "generation")
        found = find(request.query_params.get("id", ""))
        if found is None:
            raise ApiError(404, missing.format(id=request.query_params.get("id")), "not_found")
    except ApiError as exc:
        return error_response(exc)
    return JSONResponse({"data": found})


async def stats(emulator: Emulator, request: Request) -> Response:
    traffic, account, engine = emulator.traffic, emulator.account, emulator.engine
    return JSONResponse(
        {
            "pid": os.getpid(),
            "requests_received": traffic.requests_received,
            "requests_billed": account.requests_billed,
            "responses_completed": traffic.responses_completed,
            "in_flight": traffic.in_flight,
            "usd_charged": account.usd_charged,
            "credit_limit": account.credit_limit,
            "key_limit": account.key_limit,
            "in_flight_budget": account.in_flight_budget,
            "reserved_usd": account.reserved_usd,
            "prompt_tokens": account.prompt_tokens,
            "completion_tokens": account.completion_tokens,
            "errors": {str(status): n for status, n in sorted(traffic.errors.items())},
            "faults": dict(sorted(traffic.faults.items())),
            "batches": engine.batches,
            "batched_sequences": engine.sequences,
            "largest_batch": engine.largest_batch,
        }
    )


async def credit(emulator: Emulator, request: Request) -> Response:
    """Change limits live, each `USD` or null for none: `{"limit"}` the credit (402 once spent),
    `{"key_limit"}` the key's own limit (403), `{"in_flight_budget"}` the in-flight budget (402,
    retry)."""
    try:
        body = await request.json()
    except ValueError:
        body = None
    try:
        return JSONResponse(emulator.account.set_limits(body))
    except ApiError as exc:
        return error_response(exc)


def build_app(emulator: Emulator, extra_routes: Sequence[Route] = ()) -> Starlette:
    """The ASGI app (with a mode's `extra_routes`); the engine's worker runs for as long as the app does."""
    routes = [
        Route("/api/v1/models", partial(models, emulator)),
        Route("/api/v1/models/{author}/{slug}/endpoints", partial(model_endpoints, emulator)),
        Route("/api/v1/key", partial(key, emulator)),
        Route("/api/v1/generation", partial(generation, emulator)),
        Route("/api/v1/generation/content", partial(generation_content, emulator)),
        Route("/api/v1/chat/completions", emulator.chat_completions, methods=["POST"]),
        Route("/api/v1/emulator/stats", partial(stats, emulator)),
        Route("/api/v1/emulator/credit", partial(credit, emulator), methods=["POST"]),
        *extra_routes,
    ]

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        emulator.engine.start()
        try:
            yield
        finally:
            await asyncio.to_thread(emulator.engine.close)

    return Starlette(routes=routes, lifespan=lifespan)
