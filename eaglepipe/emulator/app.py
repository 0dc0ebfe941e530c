"""The HTTP side: OpenRouter's paths under /api/v1, answered from the engine and the endpoint table.

Beyond OpenRouter's API, `GET /api/v1/emulator/stats` reports what the server saw (requests received
and billed, dollars, tokens, batches), so tests and rehearsals can check what a client really sent.
Streams carry `choices[0].token_ids` per chunk and `prompt_token_ids` on the first chunk when the
request sets `return_token_ids` (the vLLM/SGLang extension); non-streamed answers carry them once.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import os
import time
from collections import Counter, OrderedDict
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from eaglepipe.emulator.chat_request import ChatRequest, parse_chat_request
from eaglepipe.emulator.completion import Completion, logprobs_body
from eaglepipe.emulator.engine import Engine, EngineError, GenerationRequest
from eaglepipe.emulator.errors import ApiError
from eaglepipe.emulator.providers import Endpoint
from eaglepipe.emulator.routing import route
from eaglepipe.emulator.text import StreamDecoder, TokenBytes, decode
from eaglepipe.target.chat import render_prompt_ids

log = logging.getLogger(__name__)

KEPT_GENERATIONS = 200_000  # `/generation` answers for this many recent ids; older ones are forgotten


@dataclass
class Ledger:
    """What the server has been asked and charged; all of it lives on the event loop's thread."""

    credit_limit: float | None = None
    requests_received: int = 0
    requests_billed: int = 0
    usd_charged: float = 0.0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    errors: Counter[int] = field(default_factory=Counter)
    generations: OrderedDict[str, dict[str, Any]] = field(default_factory=OrderedDict)

    def check_credit(self) -> None:
        if self.credit_limit is not None and self.usd_charged >= self.credit_limit:
            raise ApiError(
                402,
                f"Key limit exceeded: ${self.usd_charged:.6f} used of a ${self.credit_limit:g} "
                "limit; raise the key's limit to continue",
                "payment_required",
            )

    def record(self, completion: Completion) -> None:
        if completion.billed:
            self.requests_billed += 1
            self.usd_charged += completion.costs()[2]
            self.prompt_tokens += completion.prompt_tokens
            self.completion_tokens += completion.completion_tokens
        self.generations[completion.id] = completion.generation_record()
        while len(self.generations) > KEPT_GENERATIONS:
            self.generations.popitem(last=False)


def _sse(payload: dict[str, Any]) -> str:
    return f"data: {json.dumps(payload, separators=(',', ':'))}\n\n"


def _error(exc: ApiError) -> JSONResponse:
    return JSONResponse(exc.body(), status_code=exc.status)


class Emulator:
    """One served model: its endpoint table, engine, billing and (optional) key."""

    def __init__(
        self,
        engine: Engine,
        tokenizer: Any,
        endpoints: Sequence[Endpoint],
        *,
        model_id: str,
        context_length: int,
        credit_limit: float | None = None,
        api_key: str | None = None,
    ) -> None:
        self.engine = engine
        self.tokenizer = tokenizer
        self.endpoints = list(endpoints)
        self.model_id = model_id
        self.context_length = context_length
        self.api_key = api_key
        self.ledger = Ledger(credit_limit=credit_limit)
        self.token_bytes = TokenBytes(tokenizer)
        self.started_at = int(time.time())

    def _authorize(self, request: Request) -> None:
        if self.api_key is None:
            return
        header = request.headers.get("authorization")
        if not header:
            raise ApiError(401, "Missing Authentication header", "authentication")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(
            token.strip().encode(), self.api_key.encode()
        ):
            raise ApiError(
                401, "Invalid API key: it differs from the one this emulator requires", "authentication"
            )

    # --- catalogue -------------------------------------------------------------------------------

    def _model(self) -> dict[str, Any]:
        routable = [e for e in self.endpoints if e.status == 0] or self.endpoints
        cheapest = min(routable, key=lambda e: e.price("prompt") + e.price("completion"))
        supported = sorted({p for e in self.endpoints for p in e.public["supported_parameters"]})
        return {
            "id": self.model_id,
            "canonical_slug": self.model_id,
            "name": self.model_id,
            "created": self.started_at,
            "description": "The local target model, served by the emulator.",
            "pricing": cheapest.public["pricing"],
            "context_length": self.context_length,
            "architecture": {
                "modality": "text->text",
                "input_modalities": ["text"],
                "output_modalities": ["text"],
                "tokenizer": "Other",
                "instruct_type": "chatml",
            },
            "top_provider": {
                "context_length": self.context_length,
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
            "links": {"details": f"/api/v1/models/{self.model_id}/endpoints"},
            "reasoning": {"mandatory": False, "default_enabled": False, "supported_efforts": None},
        }

    async def models(self, request: Request) -> Response:
        return JSONResponse({"data": [self._model()], "total_count": 1, "links": {"next": None}})

    async def model_endpoints(self, request: Request) -> Response:
        requested = f"{request.path_params['author']}/{request.path_params['slug']}"
        if requested != self.model_id:
            return _error(
                ApiError(
                    404,
                    f"Model {requested!r} not found (this emulator serves {self.model_id!r})",
                    "not_found",
                )
            )
        model = self._model()
        data = {key: model[key] for key in ("id", "name", "created", "description", "architecture")}
        return JSONResponse({"data": {**data, "endpoints": [e.public for e in self.endpoints]}})

    # --- account ---------------------------------------------------------------------------------

    async def key(self, request: Request) -> Response:
        try:
            self._authorize(request)
        except ApiError as exc:
            return _error(exc)
        used, limit = self.ledger.usd_charged, self.ledger.credit_limit
        return JSONResponse(
            {
                "data": {
                    "label": "emulator",
                    "limit": limit,
                    "limit_remaining": None if limit is None else max(0.0, limit - used),
                    "limit_reset": None,
                    "include_byok_in_limit": False,
                    "usage": used,
                    "usage_daily": used,
                    "usage_weekly": used,
                    "usage_monthly": used,
                    "byok_usage": 0.0,
                    "byok_usage_daily": 0.0,
                    "byok_usage_weekly": 0.0,
                    "byok_usage_monthly": 0.0,
                    "is_free_tier": False,
                    "is_management_key": False,
                    "is_provisioning_key": False,
                    "creator_user_id": None,
                    "expires_at": None,
                    "rate_limit": {
                        "requests": -1,
                        "interval": "10s",
                        "note": "This field is deprecated and safe to ignore.",
                    },
                }
            }
        )

    async def generation(self, request: Request) -> Response:
        try:
            self._authorize(request)
            record = self.ledger.generations.get(request.query_params.get("id", ""))
            if record is None:
                raise ApiError(404, f"Generation {request.query_params.get('id')!r} not found", "not_found")
        except ApiError as exc:
            return _error(exc)
        return JSONResponse({"data": record})

    async def stats(self, request: Request) -> Response:
        ledger, engine = self.ledger, self.engine
        return JSONResponse(
            {
                "pid": os.getpid(),
                "requests_received": ledger.requests_received,
                "requests_billed": ledger.requests_billed,
                "usd_charged": ledger.usd_charged,
                "prompt_tokens": ledger.prompt_tokens,
                "completion_tokens": ledger.completion_tokens,
                "errors": {str(status): n for status, n in sorted(ledger.errors.items())},
                "batches": engine.batches,
                "batched_sequences": engine.sequences,
                "largest_batch": engine.largest_batch,
            }
        )

    # --- completions -----------------------------------------------------------------------------

    async def _prepare(self, request: Request) -> tuple[ChatRequest, Completion, GenerationRequest]:
        self._authorize(request)
        try:
            body = await request.json()
        except ValueError:
            raise ApiError(400, "request body is not valid JSON", "invalid_request") from None
        chat = parse_chat_request(body)
        if chat.model != self.model_id:
            raise ApiError(
                400,
                f"{chat.model} is not a valid model ID (this emulator serves {self.model_id})",
                "invalid_request",
            )
        self.ledger.check_credit()
        try:
            prompt_ids = render_prompt_ids(self.tokenizer, chat.messages, chat.tools)
        except Exception as exc:  # a template error on odd messages is the client's to fix
            raise ApiError(
                400, f"messages cannot be rendered by the model's chat template: {exc}", "invalid_prompt"
            ) from None
        room = self.context_length - len(prompt_ids)
        if room < 1:
            raise ApiError(
                400,
                f"This endpoint's maximum context length is {self.context_length} tokens; the "
                f"prompt has {len(prompt_ids)}",
                "context_length_exceeded",
            )
        endpoint = route(
            self.endpoints,
            chat.provider,
            requested_parameters=set(chat.parameters),
            max_tokens=chat.max_tokens,
        )
        wanted = chat.max_tokens if endpoint.supports("max_tokens") else None
        max_tokens = min(wanted or endpoint.public["max_completion_tokens"] or room, room)
        generation = GenerationRequest(
            prompt_ids=prompt_ids, max_tokens=max_tokens, **chat.sampling_on(endpoint)
        )
        completion = Completion(
            model_id=self.model_id,
            endpoint=endpoint,
            prompt_ids=prompt_ids,
            stop_id=self.engine.stop_id,
            streamed=chat.stream,
        )
        return chat, completion, generation

    def _settle(self, completion: Completion, finished: bool, failed: bool = False) -> None:
        completion.cancelled = not finished and not failed
        completion.failed = failed
        completion.finished_s = time.monotonic() - completion.started
        self.ledger.record(completion)

    async def chat_completions(self, request: Request) -> Response:
        self.ledger.requests_received += 1
        try:
            chat, completion, generation = await self._prepare(request)
        except ApiError as exc:
            self.ledger.errors[exc.status] += 1
            return _error(exc)
        headers = {"X-Generation-Id": completion.id}
        if chat.stream:
            return StreamingResponse(
                self._events(chat, completion, generation),
                media_type="text/event-stream",
                headers={**headers, "Cache-Control": "no-cache"},
            )
        finished = failed = False
        try:
            async for token in self.engine.stream(generation):
                completion.add(token)
            finished = True
        except EngineError as exc:
            failed = True
            self.ledger.errors[500] += 1
            return _error(ApiError(500, str(exc), "server"))
        finally:
            self._settle(completion, finished, failed)
        logprobs = (
            logprobs_body(completion.answer_tokens, self.token_bytes)
            if generation.top_logprobs is not None
            else None
        )
        content = decode(self.tokenizer, completion.completion_ids)
        return JSONResponse(completion.body(content, logprobs, chat.return_token_ids), headers=headers)

    async def _events(
        self, chat: ChatRequest, completion: Completion, generation: GenerationRequest
    ) -> AsyncIterator[str]:
        decoder = StreamDecoder(self.tokenizer)
        finished = failed = False
        chunks_sent = 0

        def with_prompt_ids(chunk: dict[str, Any]) -> dict[str, Any]:
            if chat.return_token_ids and chunks_sent == 0:
                chunk["prompt_token_ids"] = completion.prompt_ids
            return chunk

        yield ": OPENROUTER PROCESSING\n\n"
        try:
            async for token in self.engine.stream(generation):
                completion.add(token)
                if token.token_id == completion.stop_id:
                    continue
                logprobs = logprobs_body([token], self.token_bytes) if token.logprob is not None else None
                chunk = completion.chunk(
                    decoder.push(token.token_id),
                    logprobs=logprobs,
                    token_ids=[token.token_id] if chat.return_token_ids else None,
                )
                yield _sse(with_prompt_ids(chunk))
                chunks_sent += 1
            finished = True
            yield _sse(with_prompt_ids(completion.chunk(decoder.flush(), finish=True)))
            yield _sse(completion.usage_chunk())
        except EngineError as exc:
            failed = True
            self.ledger.errors[500] += 1
            yield _sse(
                {
                    **completion.header("chat.completion.chunk"),
                    "error": {"code": 500, "message": str(exc), "metadata": {"error_type": "server"}},
                    "choices": [{"index": 0, "delta": {"content": ""}, "finish_reason": "error"}],
                }
            )
        finally:
            self._settle(completion, finished, failed)
        yield "data: [DONE]\n\n"


def build_app(emulator: Emulator) -> Starlette:
    """The ASGI app; the engine's worker runs for as long as the app does."""
    routes = [
        Route("/api/v1/models", emulator.models),
        Route("/api/v1/models/{author}/{slug}/endpoints", emulator.model_endpoints),
        Route("/api/v1/key", emulator.key),
        Route("/api/v1/generation", emulator.generation),
        Route("/api/v1/chat/completions", emulator.chat_completions, methods=["POST"]),
        Route("/api/v1/emulator/stats", emulator.stats),
    ]

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        emulator.engine.start()
        try:
            yield
        finally:
            await asyncio.to_thread(emulator.engine.close)

    return Starlette(routes=routes, lifespan=lifespan)
