"""Chat completions, the heart of the HTTP side: a request checked (key, body, model, credit, context),
routed to an endpoint, given its fault (faults.py; none unless a test plugs a plan in), its worst case
reserved against the in-flight budget, and answered from the engine (streaming.py) or as the fault says
(injected.py). The other paths and the app are routes.py's; billing is account.py's.

Every mode shares every line here; only the engine and the text side differ (backend.py). Streams carry
`choices[0].token_ids` per chunk and `prompt_token_ids` on the first chunk when the request sets
`return_token_ids` (the vLLM/SGLang extension); non-streamed answers carry them once.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from functools import partial
from typing import cast

from starlette.requests import Request
from starlette.responses import Response

from eaglepipe.emulator import shapes
from eaglepipe.emulator.account import Account, Traffic
from eaglepipe.emulator.backend import (
    GenerationRequest,
    PromptText,
    ReplyShape,
    TextReplies,
    TokenEngine,
    TokenText,
)
from eaglepipe.emulator.chat_request import ChatRequest, parse_chat_request
from eaglepipe.emulator.completion import Completion
from eaglepipe.emulator.errors import ApiError
from eaglepipe.emulator.faults import NO_FAULT, FaultRule, FaultSource, NoFaults
from eaglepipe.emulator.injected import (
    Windows,
    broken_json,
    dropped_connection,
    empty_answer,
    error_answer,
    stray_endpoint,
)
from eaglepipe.emulator.providers import Endpoint
from eaglepipe.emulator.routes import error_response
from eaglepipe.emulator.routing import route
from eaglepipe.emulator.streaming import Answer, Delivery, EventStream
from eaglepipe.target.kimi_chat import tool_history

_TAILS = frozenset({"usage_after_finish", "duplicate_finish", "ended_after_finish"})
_FINISH_STYLES = frozenset({"finish_unnormalised", "finish_native_only", "finish_missing", "content_filter"})


class Emulator:
    """One served model's chat completions: its endpoint table, engine, text side and faults, over an
    `Account` (key, limits, billing) and the server's `Traffic`; answers go out through `Delivery`
    (streaming.py). `replies` shapes answers (default: plain text decoded by `text`; a Kimi-layout
    target: per-endpoint habits). The other paths are routes.py's."""

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
        self.windows = Windows(self.traffic)
        self.delivery = Delivery(engine, text, self.replies, self.account, self.traffic)
        self.started_at = int(time.time())

    def authorize(self, request: Request) -> None:
        self.account.authorize(request.headers.get("authorization"))

    async def _prepare(self, request: Request) -> tuple[ChatRequest, Endpoint, GenerationRequest]:
        self.authorize(request)
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
        except ApiError:  # the text side's own answer (the tests' Kimi mode: a conversation it cannot answer)
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

    def _fault_for(self, chat: ChatRequest, endpoint: Endpoint) -> tuple[FaultRule, Endpoint]:
        """This request's fault (NO_FAULT for none) and the endpoint that serves and bills it."""
        fault = self.faults.draw("chat", endpoint.answer_name)
        if fault.kind == "wrong_provider":
            stray = stray_endpoint(self.endpoints, endpoint, chat.provider)
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
            response = error_response(exc)
        finally:
            if not isinstance(response, EventStream):  # a stream leaves the count when it closes
                traffic.in_flight -= 1
        return response

    async def _respond(self, request: Request) -> Response:
        chat, endpoint, generation = await self._prepare(request)
        closed = self.windows.answer(endpoint)
        if closed is not None:
            return closed
        fault, endpoint = self._fault_for(chat, endpoint)
        shape = shapes.ERRORS.get(fault.shape or "")
        if shape is not None and (fault.kind == "burst" or shape.where == "http"):
            return self.windows.shape_error(shape, endpoint)
        if fault.kind in ("status", "burst"):
            raise fault.api_error()
        prompt_usd = len(generation.prompt_ids) * endpoint.price("prompt")
        worst_case = prompt_usd + generation.max_tokens * endpoint.price("completion")
        reserved = self.account.reserve(worst_case, generation.max_tokens)
        try:
            response = await self._answer(chat, endpoint, generation, fault)
        except BaseException:
            self.account.release(reserved)
            raise
        if isinstance(response, EventStream):  # the reservation lasts until the stream closes
            close = response.on_close

            def close_and_release() -> None:
                close()
                self.account.release(reserved)

            response.on_close = close_and_release
        else:
            self.account.release(reserved)
        return response

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
            return dropped_connection(chat.stream, headers)
        elif fault.kind == "empty_choices":
            return empty_answer(chat, completion, headers, self.account)
        elif fault.kind == "error_in_200" or (fault.kind == "midstream_error" and not chat.stream):
            return error_answer(chat, completion, headers, self.traffic)
        elif in_200 is not None and (not chat.stream or in_200.where in ("body", "choice")):
            return error_answer(chat, completion, headers, self.traffic, in_200)
        elif fault.shape == "no_output":
            return empty_answer(chat, completion, headers, self.account, with_choice=True)
        elif fault.shape == "not_json":
            return broken_json(chat, completion, headers)
        answer = Answer(
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
            return EventStream(
                self.delivery.events(answer), partial(self.delivery.end_stream, answer), headers
            )
        if fault.shape == "unfinished":
            completion.finish_style = "finish_missing"
        whole = await self.delivery.whole(answer, headers, empty=fault.shape == "unfinished")
        return dropped_connection(False, headers) if fault.kind == "cutoff" else whole
