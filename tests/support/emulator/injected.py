"""The answers a fault rule (fault_plan.py) asks for: a dropped connection, an HTTP 200 without choices,
with cut JSON or with a provider's error inside, a taxonomy shape's HTTP error, the closed rate-limit
windows some shapes open, and the odd ways a provider says an answer finished. The package's server
(eaglepipe/emulator) has none of them; fault_source.py hands them to it through its hook.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any, cast

from starlette.responses import JSONResponse, Response, StreamingResponse

from eaglepipe.chat_api import ApiErrorObject
from eaglepipe.emulator.account import Account, Traffic
from eaglepipe.emulator.chat_request import ChatRequest
from eaglepipe.emulator.completion import Completion, FinishFields
from eaglepipe.emulator.errors import ApiError
from eaglepipe.emulator.providers import Endpoint
from eaglepipe.emulator.routing import slug_matches
from eaglepipe.emulator.streaming import DONE, PROCESSING, sse
from support.emulator import shapes


class InjectedReset(Exception):
    """Raised to break a connection on purpose (the `reset` and `cutoff` faults)."""


def hide_injected_resets(record: logging.LogRecord) -> bool:
    """A log filter for uvicorn, which logs every exception that ends a response: a reset on purpose
    is no error."""
    return not (record.exc_info and isinstance(record.exc_info[1], InjectedReset))


def shaped_error(shape: shapes.ErrorShape | None, provider: str) -> tuple[int, dict[str, Any]]:
    """(status, error object) of an error inside an HTTP 200 or a stream: the shape's as `provider` sends
    it, else a generic 502."""
    if shape is None:
        generic = ApiError(
            502, "Provider returned an error mid-answer (emulator fault injection)", "upstream"
        )
        error: dict[str, Any] = {**generic.body()["error"]}  # a shape's may be off the API's form
        return generic.status, error
    return shape.status, shape.error(time.time(), provider)


def error_chunk(
    completion: Completion, error: dict[str, Any], *, with_choices: bool = True
) -> dict[str, Any]:
    """A provider's error inside a stream, with its failed choice or (as some providers send it) with
    empty `choices`."""
    chunk = completion.error_chunk(error)
    return chunk if with_choices else {**chunk, "choices": []}


def sse_answer(chunks: list[dict[str, Any]], headers: dict[str, str]) -> Response:
    """A short stream sent whole: the injected answers that carry no tokens."""
    text = PROCESSING + "".join(sse(chunk) for chunk in chunks) + DONE
    return Response(text, media_type="text/event-stream", headers={**headers, "Cache-Control": "no-cache"})


# What providers call a finish in their own words (`native_finish_reason`).
_NATIVE_FINISH = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}


def finish_saying(style: str) -> Callable[[str], FinishFields]:
    """How a provider with a taxonomy quirk (shapes.QUIRKS: `finish_unnormalised`, `finish_native_only`,
    `content_filter`, `finish_missing`) reports a stop or length, for `Completion.says_finish`."""

    def says(reason: str) -> FinishFields:
        if style == "content_filter":
            return {"finish_reason": "content_filter", "native_finish_reason": "SAFETY"}
        native = _NATIVE_FINISH.get(reason, reason)
        if style == "finish_unnormalised":
            return {"finish_reason": native, "native_finish_reason": native}
        if style == "finish_native_only":
            return {"finish_reason": None, "native_finish_reason": native}
        return {"finish_reason": None, "native_finish_reason": None}  # finish_missing, unfinished

    return says


def dropped_connection(streamed: bool, headers: dict[str, str]) -> Response:
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


def empty_answer(
    chat: ChatRequest,
    completion: Completion,
    headers: dict[str, str],
    account: Account,
    *,
    with_choice: bool = False,
) -> Response:
    """An HTTP 200 without choices, as OpenRouter sometimes sends, or (`with_choice`) one whose only
    choice stopped at once with nothing in it; nothing is billed."""
    completion.complete = with_choice
    account.record(completion, None)
    stopped = {"index": 0, "logprobs": None, "finish_reason": "stop", "native_finish_reason": "stop"}
    if chat.stream:
        head = completion.header("chat.completion.chunk")
        chunk = {**head, "choices": [{**stopped, "delta": {"role": "assistant", "content": ""}}]}
        return sse_answer([*([chunk] if with_choice else []), completion.usage_chunk()], headers)
    message = {"role": "assistant", "content": "", "refusal": None, "reasoning": None}
    choices = [{**stopped, "message": message}]
    body = {
        **completion.header("chat.completion"),
        "choices": choices if with_choice else [],
        "usage": completion.usage(),
    }
    return JSONResponse(body, headers=headers)


def broken_json(chat: ChatRequest, completion: Completion, headers: dict[str, str]) -> Response:
    """An HTTP 200 whose body (or an event of it) is cut JSON; nothing is billed."""
    head = json.dumps(completion.header("chat.completion.chunk"))[:-1] + ', "choices": [{"delta": {"cont'
    if chat.stream:
        text = f"{PROCESSING}data: {head}\n\n{DONE}"
        return Response(text, media_type="text/event-stream", headers=headers)
    return Response(head, media_type="application/json", headers=headers)


def error_answer(
    chat: ChatRequest,
    completion: Completion,
    headers: dict[str, str],
    traffic: Traffic,
    shape: shapes.ErrorShape | None = None,
) -> Response:
    """An HTTP 200 that carries a provider's error instead of an answer (a generic 502, or a
    taxonomy shape's error where it puts it); nothing is billed."""
    status, error = shaped_error(shape, completion.endpoint.answer_name)
    traffic.errors[status] += 1
    completion.failed = True
    without_choices = shape is not None and shape.where in ("body", "chunk_no_choices")
    if chat.stream:
        return sse_answer([error_chunk(completion, error, with_choices=not without_choices)], headers)
    if without_choices:
        assert shape is not None
        return JSONResponse({"error": error, **shape.extra}, headers=headers)
    # The HTTP 200 whose only choice failed (finish_reason "error"), as OpenRouter sends when a provider errs.
    body = completion.body({}, None, with_token_ids=False)
    body["choices"][0]["error"] = cast(ApiErrorObject, error)
    return JSONResponse(body, headers=headers)


def stray_endpoint(
    endpoints: Sequence[Endpoint], served: Endpoint, provider: dict[str, Any] | None
) -> Endpoint | None:
    """Where a misbehaving router sends the request (`wrong_provider`): the cheapest live endpoint
    outside `only`."""
    only = [slug.lower() for slug in (provider or {}).get("only", [])]
    outside = [
        e
        for e in endpoints
        if e is not served and e.status == 0 and not any(slug_matches(s, e.tag) for s in only)
    ]
    return min(outside, key=lambda e: e.price("prompt") + e.price("completion"), default=None)


class Windows:
    """Closed rate-limit windows: scope ("account", or a provider's name) -> (opened at, until, shape).
    Every request a closed window covers gets the same 429, with the reset it gave."""

    def __init__(self) -> None:
        self.closed: dict[str, tuple[float, float, shapes.ErrorShape]] = {}

    def shape_error(self, shape: shapes.ErrorShape, endpoint: Endpoint, traffic: Traffic) -> Response:
        """A taxonomy shape's HTTP error, closing the window it opens (if any)."""
        if shape.window_s is not None:
            scope = endpoint.answer_name if shape.window_scope == "provider" else "account"
            now = time.time()
            self.closed[scope] = (now, now + shape.window_s, shape)
        return _shape_response(shape, endpoint, traffic)

    def answer(self, endpoint: Endpoint, traffic: Traffic) -> Response | None:
        """The 429 of a window still closed over this request, or None."""
        now = time.time()
        for scope in ("account", endpoint.answer_name):
            opened, until, shape = self.closed.get(scope, (0.0, 0.0, None))
            if shape is not None and now < until:
                traffic.faults["closed_window"] += 1
                return _shape_response(shape, endpoint, traffic, opened)
        return None


def _shape_response(
    shape: shapes.ErrorShape, endpoint: Endpoint, traffic: Traffic, now: float | None = None
) -> Response:
    """A shape's status, headers and body (a web page for an edge error); `now` is when its window
    opened, for a window's later answers."""
    traffic.errors[shape.status] += 1
    now = time.time() if now is None else now
    media = "text/html; charset=UTF-8" if shape.html is not None else "application/json"
    return Response(
        shape.body(now, endpoint.answer_name),
        status_code=shape.status,
        headers=shape.headers(now),
        media_type=media,
    )
