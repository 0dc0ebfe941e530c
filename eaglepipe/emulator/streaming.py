"""How a generated answer goes out and is settled: whole in one body, or as SSE events as the tokens come,
and billed and recorded once however it ends (finished, failed, cut, or the client gone).

A stream starts with OpenRouter's `PROCESSING` comment, carries `tokens_per_event` tokens per content
chunk (with their ids and logprobs when asked) and ends with its finish chunk, usage and `[DONE]`. An
`Answer` may carry a fault (faults.py), called where a stream can stall, fail, be cut or end oddly.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from eaglepipe.chat_api import ChatCompletion
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
from eaglepipe.emulator.errors import ApiError
from eaglepipe.emulator.faults import StreamFailure, StreamFault, StreamTail

PROCESSING = ": OPENROUTER PROCESSING\n\n"
DONE = "data: [DONE]\n\n"


@dataclass(eq=False)
class Answer:
    """One request being generated, and the fault (if any) called at the points a stream can go wrong."""

    chat: ChatRequest
    completion: Completion
    generation: GenerationRequest
    tokens: AsyncIterator[GeneratedToken]
    fault: StreamFault | None = None
    settled: bool = False


class _MidstreamError(Exception):
    """Ends a stream with `failure`'s error chunk."""

    def __init__(self, failure: StreamFailure) -> None:
        super().__init__(failure.status)
        self.failure = failure


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


def _server_error(exc: Exception) -> dict[str, Any]:
    """As a stream's error chunk carries it: an object a fault's shape may also send off the API's form."""
    return {**ApiError(500, str(exc), "server").body()["error"]}


def _checked(outcome: StreamFailure | bool) -> bool:
    """A fault hook's answer: an error ends the stream with it; else whether the hook said stop."""
    if isinstance(outcome, StreamFailure):
        raise _MidstreamError(outcome)
    return outcome


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

    async def whole(self, answer: Answer) -> ChatCompletion:
        """The generated answer's body, in one piece."""
        completion = answer.completion
        try:
            async for token in answer.tokens:
                completion.add(token)
            completion.complete = True
            message = self.replies.message(completion)  # before settling: it sets the finish reason's cause
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
        return completion.body(message, logprobs, with_token_ids)

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

        fault = answer.fault
        yield PROCESSING
        if fault is not None:
            async for comment in fault.before_tokens():
                yield comment
        group: list[GeneratedToken] = []
        try:
            async for token in answer.tokens:
                completion.add(token)
                if token.token_id != completion.stop_id:
                    group.append(token)
                if len(group) == generation.event_tokens:
                    yield content(group)
                    group = []
                    if fault is not None and _checked(fault.after_event(completion)):
                        break
            else:
                if group:
                    yield content(group)
            if fault is not None and _checked(fault.after_tokens(completion)):
                return  # the body ends here; `on_close` settles it
            completion.complete = True
            *rest, last = deltas.flush() or [{"content": ""}]
            for delta in rest:
                yield event(completion.chunk(delta))
            yield event(completion.chunk(last, finish=True))
            tail = StreamTail([completion.usage_chunk()] if completion.reports_usage else [])
            if fault is not None:
                tail = fault.tail(completion, tail)
            for chunk in tail.chunks:
                yield event(chunk)
            if not tail.done:
                self.end_stream(answer)
                return
        except (GenerationFailed, _MidstreamError) as exc:
            failure = (
                exc.failure
                if isinstance(exc, _MidstreamError)
                else StreamFailure(500, completion.error_chunk(_server_error(exc)))
            )
            completion.failed = True
            self.traffic.errors[failure.status] += 1
            yield sse(failure.chunk)
        self.end_stream(answer)  # before the last bytes, so `/generation` knows it once they arrive
        yield DONE

    def end_stream(self, answer: Answer) -> None:
        """Settle a stream once, however it ended. A client that left an engine that cannot cancel is
        billed for the whole answer, once the engine has run it out; so is one whose fault `runs_out`,
        whatever the engine."""
        if answer.settled:
            return
        answer.settled = True
        completion = answer.completion
        cancels = self.engine.cancellable and not (answer.fault is not None and answer.fault.runs_out)
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
