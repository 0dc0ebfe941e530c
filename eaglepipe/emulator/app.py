"""The HTTP side: OpenRouter's paths under /api/v1, answered from the engine, the endpoint table and the
account (account.py: key, limits, charges, generation records).

Every mode shares every line here; only the engine and the text side differ (backend.py), and what
`faults` (faults.py) hands each request: nothing unless a test plugs a plan in. Beyond OpenRouter's API,
`/api/v1/emulator/` reports what the server saw (`GET stats`: requests received and billed, dollars,
tokens, batches, in flight, injected faults) and lets a test change the credit limit live (`POST
credit`). Streams carry `choices[0].token_ids` per chunk and
`prompt_token_ids` on the first chunk when the request sets `return_token_ids` (the vLLM/SGLang
extension); non-streamed answers carry them once.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from functools import partial
from typing import Any, cast

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from eaglepipe.emulator import shapes
from eaglepipe.emulator.account import Account
from eaglepipe.emulator.backend import (
    GeneratedToken,
    GenerationFailed,
    GenerationRequest,
    PromptText,
    ReplyShape,
    TextReplies,
    TokenEngine,
    TokenText,
)
from eaglepipe.emulator.chat_request import ChatRequest, parse_chat_request
from eaglepipe.emulator.completion import Completion, logprobs_body
from eaglepipe.emulator.errors import ApiError
from eaglepipe.emulator.faults import NO_FAULT, FaultRule, FaultSource, NoFaults
from eaglepipe.emulator.providers import Endpoint
from eaglepipe.emulator.routing import route, slug_matches
from eaglepipe.target.kimi_chat import tool_history

log = logging.getLogger(__name__)

PROCESSING = ": OPENROUTER PROCESSING\n\n"
KEEPALIVE_EVERY_S = 1.0  # a stalled stream sends PROCESSING this often, as OpenRouter does while it waits
DONE = "data: [DONE]\n\n"


class InjectedReset(Exception):
    """Raised to break a connection on purpose (the `reset` fault)."""


def hide_injected_resets(record: logging.LogRecord) -> bool:
    """A log filter for uvicorn, which logs every exception that ends a response: a reset on purpose
    is no error."""
    return not (record.exc_info and isinstance(record.exc_info[1], InjectedReset))


@dataclass
class Traffic:
    """What the server has been asked and how it answered (the account keeps what was charged); all of it
    lives on the event loop's thread."""

    requests_received: int = 0
    responses_completed: int = 0
    in_flight: int = 0
    errors: Counter[int] = field(default_factory=Counter)
    faults: Counter[str] = field(default_factory=Counter)


@dataclass(eq=False)
class _Answer:
    """One request being generated; `fails_after` is where an injected midstream error cuts it (with
    `fails_with`'s error, else a generic 502)."""

    chat: ChatRequest
    completion: Completion
    generation: GenerationRequest
    tokens: AsyncIterator[GeneratedToken]
    fails_after: int | None = None
    fails_with: shapes.ErrorShape | None = None
    # The `cutoff` fault: the connection breaks after this many tokens, the provider runs the answer out;
    # with `cut_clean` (the `unfinished` shape) the body ends cleanly there instead.
    cut_after: int | None = None
    cut_clean: bool = False
    # The `stall` fault: seconds of keep-alive comments before the first token.
    stall_s: float = 0.0
    # How the stream ends after its finish chunk (`usage_after_finish`, `duplicate_finish`,
    # `ended_after_finish`; None as OpenRouter does).
    tail: str | None = None
    settled: bool = False


class _MidstreamError(Exception):
    """Ends a stream with an error chunk carrying `error` (with or without a choice)."""

    def __init__(self, status: int, error: dict[str, Any], with_choices: bool = True) -> None:
        super().__init__(error.get("message"))
        self.status = status
        self.error = error
        self.with_choices = with_choices


class _EventStream(StreamingResponse):
    """An SSE answer that calls `on_close` however the connection ends, even before its first event."""

    def __init__(
        self, events: AsyncIterator[str], on_close: Callable[[], None], headers: dict[str, str]
    ) -> None:
        headers = {**headers, "Cache-Control": "no-cache"}
        super().__init__(events, media_type="text/event-stream", headers=headers)
        self.on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.on_close()


def _sse(payload: dict[str, Any]) -> str:
    return f"data: {json.dumps(payload, separators=(',', ':'))}\n\n"


def _sse_answer(chunks: list[dict[str, Any]], headers: dict[str, str]) -> Response:
    """A short stream sent whole: the injected answers that carry no tokens."""
    text = PROCESSING + "".join(_sse(chunk) for chunk in chunks) + DONE
    return Response(text, media_type="text/event-stream", headers={**headers, "Cache-Control": "no-cache"})


def _dropped_connection(streamed: bool, headers: dict[str, str]) -> Response:
    """The headers of a 200 and the start of its body, then the connection breaks (the `reset` fault):
    a streamed answer never sends its last chunk, a plain one promises more bytes than it sends."""

    async def partial_body() -> AsyncIterator[bytes]:
        yield PROCESSING.encode() if streamed else b'{"id":'
        raise InjectedReset("connection dropped on purpose (emulator fault injection)")

    if streamed:
        return StreamingResponse(partial_body(), media_type="text/event-stream", headers=headers)
    return StreamingResponse(
        partial_body(), media_type="application/json", headers={**headers, "Content-Length": "4096"}
    )


def _injected_failure() -> ApiError:
    return ApiError(502, "Provider returned an error mid-answer (emulator fault injection)", "upstream")


def _shaped_error(shape: shapes.ErrorShape | None, completion: Completion) -> tuple[int, dict[str, Any]]:
    """(status, error object) of an error inside an HTTP 200: the shape's, else the generic 502."""
    if shape is None:
        generic = _injected_failure()
        return generic.status, generic.body()["error"]
    return shape.status, shape.error(time.time(), completion.endpoint.answer_name)


def _server_error(exc: Exception) -> dict[str, Any]:
    error: dict[str, Any] = ApiError(500, str(exc), "server").body()["error"]
    return error


def _midstream_error(answer: _Answer) -> _MidstreamError:
    with_choices = answer.fails_with is None or answer.fails_with.where != "chunk_no_choices"
    return _MidstreamError(*_shaped_error(answer.fails_with, answer.completion), with_choices)


def _error(exc: ApiError) -> JSONResponse:
    return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers())


_TAILS = frozenset({"usage_after_finish", "duplicate_finish", "ended_after_finish"})
_FINISH_STYLES = frozenset({"finish_unnormalised", "finish_native_only", "finish_missing", "content_filter"})


class Emulator:
    """One served model's routes: its endpoint table, engine, text side and faults, over an `Account`
    (key, limits, billing) and the server's `Traffic`. `replies` shapes answers (default: plain text
    decoded by `text`; Kimi mode: per-endpoint habits)."""

    def __init__(
        self,
        engine: TokenEngine,
        text: PromptText,
        endpoints: Sequence[Endpoint],
        *,
        model_id: str,
        context_length: int,
        credit_limit: float | None = None,
        key_limit: float | None = None,
        in_flight_budget: float | None = None,
        api_key: str | None = None,
        faults: FaultSource | None = None,
        tokens_per_event: int = 1,
        generation_delay_s: float = 0.0,
        replies: ReplyShape | None = None,
        store_content: bool = False,
    ) -> None:
        self.engine = engine
        self.text = text
        self.replies = replies if replies is not None else TextReplies(cast(TokenText, text))
        self.endpoints = list(endpoints)
        self.model_id = model_id
        self.context_length = context_length
        self.faults: FaultSource = faults or NoFaults()
        # Closed rate-limit windows: scope ("account", or a provider's name) -> (opened at, until, shape).
        self.windows: dict[str, tuple[float, float, shapes.ErrorShape]] = {}
        self.tokens_per_event = tokens_per_event
        self.account = Account(
            api_key=api_key,
            credit_limit=credit_limit,
            key_limit=key_limit,
            in_flight_budget=in_flight_budget,
            generation_delay_s=generation_delay_s,
            store_content=store_content,
        )
        self.traffic = Traffic()
        self.started_at = int(time.time())
        self.started = time.monotonic()
        self._running_out: set[asyncio.Task[None]] = set()

    def _authorize(self, request: Request) -> None:
        self.account.authorize(request.headers.get("authorization"))

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

    def _account_fault(self, route: str) -> None:
        """A `status`/`burst` rule on an accounting route answers in place of the route."""
        fault = self.faults.draw(route)
        if fault is not NO_FAULT:
            self.traffic.faults[f"{fault.kind}@{route}"] += 1
            raise fault.api_error()

    async def key(self, request: Request) -> Response:
        try:
            self._authorize(request)
            self._account_fault("key")
        except ApiError as exc:
            return _error(exc)
        return JSONResponse({"data": self.account.key_data()})

    async def generation(self, request: Request) -> Response:
        try:
            self._authorize(request)
            self._account_fault("generation")
            record = self.account.generation(request.query_params.get("id", ""))
            if record is None:
                raise ApiError(404, f"Generation {request.query_params.get('id')!r} not found", "not_found")
        except ApiError as exc:
            return _error(exc)
        return JSONResponse({"data": record})

    async def generation_content(self, request: Request) -> Response:
        """The stored prompt and answer text of a generation (`--store-content`), cut-off ones included."""
        try:
            self._authorize(request)
            self._account_fault("generation")
            content = self.account.content(request.query_params.get("id", ""))
            if content is None:
                raise ApiError(404, f"No content for {request.query_params.get('id')!r}", "not_found")
        except ApiError as exc:
            return _error(exc)
        return JSONResponse({"data": content})

    # --- the emulator's own paths ----------------------------------------------------------------

    async def stats(self, request: Request) -> Response:
        traffic, account, engine = self.traffic, self.account, self.engine
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

    async def credit(self, request: Request) -> Response:
        """Change limits live, each `USD` or null for none: `{"limit"}` the credit (402 once spent),
        `{"key_limit"}` the key's own limit (403), `{"in_flight_budget"}` the in-flight budget (402,
        retry)."""
        try:
            body = await request.json()
        except ValueError:
            body = None
        try:
            return JSONResponse(self.account.set_limits(body))
        except ApiError as exc:
            return _error(exc)

    # --- completions -----------------------------------------------------------------------------

    async def _prepare(self, request: Request) -> tuple[ChatRequest, Endpoint, GenerationRequest]:
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
        self.account.check_credit()
        self.account.check_key_limit()
        try:
            prompt_ids = self.text.prompt_ids(chat.messages, chat.tools, thinking=chat.thinking)
        except ApiError:  # the text side's own answer (Kimi mode: a conversation it has no answer for)
            raise
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
            prompt_ids=prompt_ids,
            max_tokens=max_tokens,
            event_tokens=self.tokens_per_event if chat.stream else max_tokens,
            **chat.sampling_on(endpoint),
        )
        return chat, endpoint, generation

    def _stray_endpoint(self, served: Endpoint, provider: dict[str, Any] | None) -> Endpoint | None:
        """Where a misbehaving router sends the request: the cheapest live endpoint outside `only`."""
        only = [slug.lower() for slug in (provider or {}).get("only", [])]
        outside = [
            e
            for e in self.endpoints
            if e is not served and e.status == 0 and not any(slug_matches(s, e.tag) for s in only)
        ]
        return min(outside, key=lambda e: e.price("prompt") + e.price("completion"), default=None)

    def _fault_for(self, chat: ChatRequest, endpoint: Endpoint) -> tuple[FaultRule, Endpoint]:
        """This request's fault (NO_FAULT for none) and the endpoint that serves and bills it."""
        fault = self.faults.draw("chat", endpoint.answer_name)
        if fault.kind == "wrong_provider":
            stray = self._stray_endpoint(endpoint, chat.provider)
            if stray is None:  # no live endpoint lies outside what the request allows
                return NO_FAULT, endpoint
            endpoint = stray
        if fault is not NO_FAULT:
            self.traffic.faults[fault.kind] += 1
        return fault, endpoint

    async def chat_completions(self, request: Request) -> Response:
        traffic = self.traffic
        traffic.requests_received += 1
        traffic.in_flight += 1
        response: Response | None = None
        try:
            response = await self._respond(request)
        except ApiError as exc:
            traffic.errors[exc.status] += 1
            response = _error(exc)
        finally:
            if not isinstance(response, _EventStream):  # a stream leaves the count when it closes
                traffic.in_flight -= 1
        return response

    async def _respond(self, request: Request) -> Response:
        chat, endpoint, generation = await self._prepare(request)
        closed = self._closed_window(endpoint)
        if closed is not None:
            return closed
        fault, endpoint = self._fault_for(chat, endpoint)
        shape = shapes.ERRORS.get(fault.shape or "")
        if shape is not None and (fault.kind == "burst" or shape.where == "http"):
            if shape.window_s is not None:
                scope = endpoint.answer_name if shape.window_scope == "provider" else "account"
                now = time.time()
                self.windows[scope] = (now, now + shape.window_s, shape)
            return self._shape_error(shape, endpoint)
        if fault.kind in ("status", "burst"):
            raise fault.api_error()
        worst_case = (
            len(generation.prompt_ids) * endpoint.price("prompt")
            + generation.max_tokens * endpoint.price("completion")
        )
        reserved = self.account.reserve(worst_case, generation.max_tokens)
        try:
            response = await self._answer(chat, endpoint, generation, fault)
        except BaseException:
            self.account.release(reserved)
            raise
        if isinstance(response, _EventStream):  # the reservation lasts until the stream closes
            close = response.on_close

            def close_and_release() -> None:
                close()
                self.account.release(reserved)

            response.on_close = close_and_release
        else:
            self.account.release(reserved)
        return response

    def _closed_window(self, endpoint: Endpoint) -> Response | None:
        """The same 429 for every request a closed rate-limit window covers, with the reset it gave."""
        now = time.time()
        for scope in ("account", endpoint.answer_name):
            opened, until, shape = self.windows.get(scope, (0.0, 0.0, None))
            if shape is not None and now < until:
                self.traffic.faults["closed_window"] += 1
                return self._shape_error(shape, endpoint, opened)
        return None

    def _shape_error(
        self, shape: shapes.ErrorShape, endpoint: Endpoint, now: float | None = None
    ) -> Response:
        """A taxonomy shape's HTTP error: its status, headers and body (a web page for an edge error);
        `now` is when its window opened, for a window's later answers."""
        self.traffic.errors[shape.status] += 1
        now = time.time() if now is None else now
        media = "text/html; charset=UTF-8" if shape.html is not None else "application/json"
        return Response(
            shape.body(now, endpoint.answer_name),
            status_code=shape.status,
            headers=shape.headers(now),
            media_type=media,
        )

    async def _answer(
        self, chat: ChatRequest, endpoint: Endpoint, generation: GenerationRequest, fault: FaultRule
    ) -> Response:
        completion = Completion(
            model_id=self.model_id,
            endpoint=endpoint,
            prompt_ids=generation.prompt_ids,
            stop_id=self.engine.stop_id,
            streamed=chat.stream,
            thinking=chat.thinking,
            tool_history=tool_history(chat.messages),
        )
        headers = {"X-Generation-Id": completion.id}
        completion.reports_usage = fault.kind != "no_usage"
        completion.reports_cost = fault.kind != "null_cost"
        if fault.shape in _FINISH_STYLES:
            completion.finish_style = fault.shape
        in_200 = shapes.ERRORS.get(fault.shape or "")
        if fault.kind == "stall" and not chat.stream:
            await asyncio.sleep(fault.seconds)
        elif fault.kind == "reset":
            return _dropped_connection(chat.stream, headers)
        elif fault.kind == "empty_choices":
            return self._empty_answer(chat, completion, headers)
        elif fault.kind == "error_in_200" or (fault.kind == "midstream_error" and not chat.stream):
            return self._error_answer(chat, completion, headers)
        elif in_200 is not None and (not chat.stream or in_200.where in ("body", "choice")):
            return self._error_answer(chat, completion, headers, in_200)
        elif fault.shape == "no_output":
            return self._empty_answer(chat, completion, headers, with_choice=True)
        elif fault.shape == "not_json":
            return self._broken_json(chat, completion, headers)
        answer = _Answer(
            chat,
            completion,
            generation,
            self.engine.stream(generation),
            fails_after=fault.after_tokens if fault.kind == "midstream_error" or in_200 else None,
            fails_with=in_200,
            cut_after=fault.after_tokens if fault.kind == "cutoff" or fault.shape == "unfinished" else None,
            cut_clean=fault.shape == "unfinished",
            stall_s=fault.seconds if fault.kind == "stall" else 0.0,
            tail=fault.shape if fault.shape in _TAILS else None,
        )
        if chat.stream:
            return _EventStream(self._events(answer), partial(self._end_stream, answer), headers)
        if fault.shape == "unfinished":
            completion.finish_style = "finish_missing"
        whole = await self._whole_answer(answer, headers, empty=fault.shape == "unfinished")
        return _dropped_connection(False, headers) if fault.kind == "cutoff" else whole

    def _empty_answer(
        self, chat: ChatRequest, completion: Completion, headers: dict[str, str], *, with_choice: bool = False
    ) -> Response:
        """An HTTP 200 without choices, as OpenRouter sometimes sends, or (`with_choice`) one whose only
        choice stopped at once with nothing in it; nothing is billed."""
        completion.complete = with_choice
        self.account.record(completion, None)
        stopped = {"index": 0, "logprobs": None, "finish_reason": "stop", "native_finish_reason": "stop"}
        if chat.stream:
            head = completion.header("chat.completion.chunk")
            chunk = {**head, "choices": [{**stopped, "delta": {"role": "assistant", "content": ""}}]}
            return _sse_answer([*([chunk] if with_choice else []), completion.usage_chunk()], headers)
        message = {"role": "assistant", "content": "", "refusal": None, "reasoning": None}
        choices = [{**stopped, "message": message}]
        body = {
            **completion.header("chat.completion"),
            "choices": choices if with_choice else [],
            "usage": completion.usage(),
        }
        return JSONResponse(body, headers=headers)

    def _broken_json(self, chat: ChatRequest, completion: Completion, headers: dict[str, str]) -> Response:
        """An HTTP 200 whose body (or an event of it) is cut JSON; nothing is billed."""
        head = json.dumps(completion.header("chat.completion.chunk"))[:-1] + ', "choices": [{"delta": {"cont'
        if chat.stream:
            text = f"{PROCESSING}data: {head}\n\n{DONE}"
            return Response(text, media_type="text/event-stream", headers=headers)
        return Response(head, media_type="application/json", headers=headers)

    def _error_answer(
        self,
        chat: ChatRequest,
        completion: Completion,
        headers: dict[str, str],
        shape: shapes.ErrorShape | None = None,
    ) -> Response:
        """An HTTP 200 that carries a provider's error instead of an answer (a generic 502, or a
        taxonomy shape's error where it puts it); nothing is billed."""
        status, error = _shaped_error(shape, completion)
        self.traffic.errors[status] += 1
        completion.failed = True
        without_choices = shape is not None and shape.where in ("body", "chunk_no_choices")
        if chat.stream:
            chunk = completion.error_chunk(error, with_choices=not without_choices)
            return _sse_answer([chunk], headers)
        if without_choices:
            assert shape is not None
            return JSONResponse({"error": error, **shape.extra}, headers=headers)
        return JSONResponse(completion.error_body(error), headers=headers)

    def _settle(self, answer: _Answer, *, client_left: bool = False) -> None:
        completion = answer.completion
        completion.cancelled = client_left or not (completion.complete or completion.failed)
        completion.finished_s = time.monotonic() - completion.started
        content = None
        # GenerationContentData: what was asked, and the answer's text as generated
        if self.account.store_content:
            error: dict[str, Any] = {
                "status": None,
                "message": "the answer ended in an error",
                "provider_name": completion.endpoint.answer_name,
                "raw": None,
                "previous_errors": [],
            }
            content = {
                "input": {"messages": answer.chat.messages},
                "output": self.replies.stored_output(completion),
                "error": error if completion.failed else None,
            }
        self.account.record(completion, content)
        self.traffic.responses_completed += completion.complete

    async def _whole_answer(
        self, answer: _Answer, headers: dict[str, str], *, empty: bool = False
    ) -> Response:
        """The generated answer in one body (`empty`: billed, but the message left empty)."""
        completion = answer.completion
        try:
            async for token in answer.tokens:
                completion.add(token)
            completion.complete = True
            message = self.replies.message(completion)  # before settling: it sets the finish reason's cause
            if empty:
                message = {"content": ""}
        except GenerationFailed as exc:
            completion.failed = True
            raise ApiError(500, str(exc), "server") from None
        finally:
            self._settle(answer)
        logprobs = (
            logprobs_body(completion.answer_tokens, self.text.token_bytes)
            if answer.generation.top_logprobs is not None
            else None
        )
        with_token_ids = answer.chat.return_token_ids and self.replies.returns_token_ids(completion.endpoint)
        return JSONResponse(completion.body(message, logprobs, with_token_ids), headers=headers)

    async def _events(self, answer: _Answer) -> AsyncIterator[str]:
        """The SSE events of a streamed answer, `event_tokens` tokens per content chunk."""
        chat, completion, generation = answer.chat, answer.completion, answer.generation
        deltas = self.replies.deltas(completion, generation)
        with_token_ids = chat.return_token_ids and self.replies.returns_token_ids(completion.endpoint)
        chunks_sent = 0

        def event(chunk: dict[str, Any]) -> str:
            nonlocal chunks_sent
            if with_token_ids and chunks_sent == 0:
                chunk["prompt_token_ids"] = completion.prompt_ids
            chunks_sent += 1
            return _sse(chunk)

        def content(tokens: list[GeneratedToken]) -> str:
            """The group's deltas, its ids and logprobs on the first (a group without deltas still sends
            one chunk for them)."""
            logprobs = (
                logprobs_body(tokens, self.text.token_bytes) if generation.top_logprobs is not None else None
            )
            ids = [t.token_id for t in tokens]
            first, *rest = deltas.push(ids) or [{"content": ""}]
            head = event(
                completion.chunk(first, logprobs=logprobs, token_ids=ids if with_token_ids else None)
            )
            return head + "".join(event(completion.chunk(delta)) for delta in rest)

        yield PROCESSING
        stall_left_s = answer.stall_s
        while stall_left_s > 0:
            pause_s = min(KEEPALIVE_EVERY_S, stall_left_s)
            await asyncio.sleep(pause_s)
            stall_left_s -= pause_s
            yield PROCESSING
        group: list[GeneratedToken] = []
        try:
            async for token in answer.tokens:
                completion.add(token)
                if token.token_id != completion.stop_id:
                    group.append(token)
                if len(group) == generation.event_tokens:
                    yield content(group)
                    group = []
                    if answer.fails_after is not None and len(completion.tokens) >= answer.fails_after:
                        raise _midstream_error(answer)
                    if answer.cut_after is not None and len(completion.tokens) >= answer.cut_after:
                        break
            else:
                if group:
                    yield content(group)
                if answer.fails_after is not None:  # the answer ended before the planned failure
                    raise _midstream_error(answer)
            if answer.cut_after is not None:  # cut here (or at its end, if it ended before the planned cut)
                if answer.cut_clean:
                    return  # the body ends cleanly; `on_close` lets the provider run the answer out
                raise InjectedReset("stream cut on purpose (emulator fault injection)")
            completion.complete = True
            *rest, last = deltas.flush() or [{"content": ""}]
            for delta in rest:
                yield event(completion.chunk(delta))
            yield event(completion.chunk(last, finish=True))
            if answer.tail == "duplicate_finish":
                yield event(completion.chunk({"content": ""}, finish=True))
            if answer.tail == "ended_after_finish":
                self._end_stream(answer)
                return
            if completion.reports_usage:
                yield _sse(completion.usage_chunk(with_choice=answer.tail == "usage_after_finish"))
        except (GenerationFailed, _MidstreamError) as exc:
            failure = exc if isinstance(exc, _MidstreamError) else _MidstreamError(500, _server_error(exc))
            completion.failed = True
            self.traffic.errors[failure.status] += 1
            yield _sse(completion.error_chunk(failure.error, with_choices=failure.with_choices))
        self._end_stream(answer)  # before the last bytes, so `/generation` knows it once they arrive
        yield DONE

    def _end_stream(self, answer: _Answer) -> None:
        """Settle a stream once, however it ended. A client that left an engine that cannot cancel is
        billed for the whole answer, once the engine has run it out; so is one cut by the `cutoff` fault,
        whatever the engine."""
        if answer.settled:
            return
        answer.settled = True
        completion = answer.completion
        cancels = self.engine.cancellable and answer.cut_after is None
        if completion.complete or completion.failed or cancels:
            self._settle(answer)
            self.traffic.in_flight -= 1
            return
        task = asyncio.get_running_loop().create_task(self._run_out(answer))
        self._running_out.add(task)
        task.add_done_callback(self._running_out.discard)

    async def _run_out(self, answer: _Answer) -> None:
        completion = answer.completion
        try:
            async for token in answer.tokens:
                completion.add(token)
            completion.complete = True
        finally:
            self._settle(answer, client_left=True)
            self.traffic.in_flight -= 1


def build_app(emulator: Emulator, extra_routes: Sequence[Route] = ()) -> Starlette:
    """The ASGI app (with a mode's `extra_routes`); the engine's worker runs for as long as the app does."""
    routes = [
        Route("/api/v1/models", emulator.models),
        Route("/api/v1/models/{author}/{slug}/endpoints", emulator.model_endpoints),
        Route("/api/v1/key", emulator.key),
        Route("/api/v1/generation", emulator.generation),
        Route("/api/v1/generation/content", emulator.generation_content),
        Route("/api/v1/chat/completions", emulator.chat_completions, methods=["POST"]),
        Route("/api/v1/emulator/stats", emulator.stats),
        Route("/api/v1/emulator/credit", emulator.credit, methods=["POST"]),
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
