"""How a generated answer goes out and is settled: whole in one body, or as SSE events as the tokens come,
and billed and recorded once however it ends (finished, failed, cut, or the client gone).

A stream starts with OpenRouter's `PROCESSING` comment, carries `tokens_per_event` tokens per content
chunk (with their ids and logprobs when asked) and ends with its finish chunk, usage and `[DONE]`. The
`Answer` also carries what an injected fault (faults.py) asks of it: a stall before the first token, an
error or a cut after some tokens, an odd tail.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from eaglepipe.emulator import shapes
from eaglepipe.emulator.account import Account, Traffic
from eaglepipe.emulator.backend import (
    GeneratedToken,
    GenerationFailed,
    GenerationRequest,
    PromptText,
    ReplyShape,
    TokenEngine,
)
from eaglepipe.emulator.chat_request import ChatRequest
from eaglepipe.emulator.completion import Completion, logprobs_body
from eaglepipe.emulator.errors import ApiError, InjectedReset
from eaglepipe.emulator.faults import shaped_error

PROCESSING = ": OPENROUTER PROCESSING\n\n"
KEEPALIVE_EVERY_S = 1.0  # a stalled stream sends PROCESSING this often, as OpenRouter does while it waits
DONE = "data: [DONE]\n\n"


def hide_injected_resets(record: logging.LogRecord) -> bool:
    """A log filter for uvicorn, which logs every exception that ends a response: a reset on purpose
    is no error."""
    return not (record.exc_info and isinstance(record.exc_info[1], InjectedReset))


@dataclass(eq=False)
class Answer:
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


class EventStream(StreamingResponse):
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


def sse(payload: dict[str, Any]) -> str:
    return f"data: {json.dumps(payload, separators=(',', ':'))}\n\n"


def sse_answer(chunks: list[dict[str, Any]], headers: dict[str, str]) -> Response:
    """A short stream sent whole: the injected answers that carry no tokens."""
    text = PROCESSING + "".join(sse(chunk) for chunk in chunks) + DONE
    return Response(text, media_type="text/event-stream", headers={**headers, "Cache-Control": "no-cache"})


def _server_error(exc: Exception) -> dict[str, Any]:
    error: dict[str, Any] = ApiError(500, str(exc), "server").body()["error"]
    return error


def _midstream_error(answer: Answer) -> _MidstreamError:
    with_choices = answer.fails_with is None or answer.fails_with.where != "chunk_no_choices"
    status, error = shaped_error(answer.fails_with, answer.completion.endpoint.answer_name)
    return _MidstreamError(status, error, with_choices)


class Delivery:
    """Sends answers and settles each once: the bill and record in the account, the counts in `traffic`.
    `replies` shapes the message and deltas; `text` gives token bytes for logprobs."""

    def __init__(
        self,
        engine: TokenEngine,
        text: PromptText,
        replies: ReplyShape,
        account: Account,
        traffic: Traffic,
    ) -> None:
        self.engine = engine
        self.text = text
        self.replies = replies
        self.account = account
        self.traffic = traffic
        self._running_out: set[asyncio.Task[None]] = set()

    def _settle(self, answer: Answer, *, client_left: bool = False) -> None:
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

    async def whole(self, answer: Answer, headers: dict[str, str], *, empty: bool = False) -> Response:
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

    async def events(self, answer: Answer) -> AsyncIterator[str]:
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
            return sse(chunk)

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
                self.end_stream(answer)
                return
            if completion.reports_usage:
                yield sse(completion.usage_chunk(with_choice=answer.tail == "usage_after_finish"))
        except (GenerationFailed, _MidstreamError) as exc:
            failure = exc if isinstance(exc, _MidstreamError) else _MidstreamError(500, _server_error(exc))
            completion.failed = True
            self.traffic.errors[failure.status] += 1
            yield sse(completion.error_chunk(failure.error, with_choices=failure.with_choices))
        self.end_stream(answer)  # before the last bytes, so `/generation` knows it once they arrive
        yield DONE

    def end_stream(self, answer: Answer) -> None:
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

    async def _run_out(self, answer: Answer) -> None:
        completion = answer.completion
        try:
            async for token in answer.tokens:
                completion.add(token)
            completion.complete = True
        finally:
            self._settle(answer, client_left=True)
            self.traffic.in_flight -= 1
