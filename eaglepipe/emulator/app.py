"""Chat completions, the heart of the HTTP side: a request checked (key, body, model, credit, context),
routed to an endpoint, its worst case reserved against the in-flight budget, and answered from the engine
(streaming.py). A fault source (faults.py; none unless a test plugs one in) may take over or alter the
answer at fixed points. The other paths and the app are routes.py's; billing is account.py's.

Every mode shares every line here; only the engine and the text side differ (backend.py). Streams carry
`choices[0].token_ids` per chunk and `prompt_token_ids` on the first chunk when the request sets
`return_token_ids` (the vLLM/SGLang extension); non-streamed answers carry them once.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from functools import partial
from typing import cast

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

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
from eaglepipe.emulator.faults import ChatCall, ChatFault, FaultSource
from eaglepipe.emulator.providers import Endpoint
from eaglepipe.emulator.routes import error_response
from eaglepipe.emulator.routing import route
from eaglepipe.emulator.streaming import Answer, Delivery, EventStream
from eaglepipe.target.kimi_chat import tool_history


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
        self.faults = faults
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
        fault = None
        if self.faults is not None:
            fault = self.faults.chat(ChatCall(chat, endpoint, self.endpoints, self.traffic, self.account))
        if fault is not None:
            endpoint = fault.endpoint
            refused = fault.refuse()
            if refused is not None:
                return refused
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
        self, chat: ChatRequest, endpoint: Endpoint, generation: GenerationRequest, fault: ChatFault | None
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
        if fault is not None:
            replaced = await fault.replace(completion, headers)
            if replaced is not None:
                return replaced
        answer = Answer(chat, completion, generation, self.engine.stream(generation), fault)
        if chat.stream:
            return EventStream(
                self.delivery.events(answer), partial(self.delivery.end_stream, answer), headers
            )
        body = await self.delivery.whole(answer)
        altered = None if fault is None else fault.whole(body, headers)
        return altered if altered is not None else JSONResponse(body, headers=headers)
