"""A fault plan (fault_plan.py) plugged into the server's hook (eaglepipe/emulator/faults.py): each request
draws its rule, and `RuleFault` carries the rule out at the points the server calls it (injected.py holds
the answers). `POST /api/v1/emulator/faults` replaces the plan live.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from functools import cached_property

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from eaglepipe.chat_api import ChatCompletion
from eaglepipe.emulator.account import Traffic
from eaglepipe.emulator.app import Emulator
from eaglepipe.emulator.completion import Completion
from eaglepipe.emulator.errors import ApiError, EmulatorError
from eaglepipe.emulator.faults import AccountRoute, ChatCall, StreamFailure, StreamTail
from eaglepipe.emulator.providers import Endpoint
from eaglepipe.emulator.routes import error_response
from eaglepipe.emulator.streaming import PROCESSING
from support.emulator import shapes
from support.emulator.fault_plan import NO_FAULT, FaultPlan, FaultRule, fault_plan
from support.emulator.injected import (
    InjectedReset,
    Windows,
    broken_json,
    dropped_connection,
    empty_answer,
    error_answer,
    error_chunk,
    finish_saying,
    shaped_error,
    stray_endpoint,
)

KEEPALIVE_EVERY_S = 1.0  # a stalled stream sends PROCESSING this often, as OpenRouter does while it waits
_FINISH_STYLES = frozenset({"finish_unnormalised", "finish_native_only", "finish_missing", "content_filter"})
# The one choice some providers repeat in the usage chunk (`usage_after_finish`).
_REPEATED_CHOICE = {"index": 0, "delta": {"content": ""}, "finish_reason": None, "native_finish_reason": None}


@dataclass
class PlannedFaults:
    """The server's `FaultSource`: `plan`'s rule for each request, and the rate-limit windows its shapes
    close (a new plan starts with all of them open)."""

    plan: FaultPlan
    windows: Windows = field(default_factory=Windows)

    def chat(self, call: ChatCall) -> RuleFault | None:
        closed = self.windows.answer(call.endpoint, call.traffic)
        if closed is not None:  # answered before any draw, so the plan's sequence stays as it was
            return RuleFault(NO_FAULT, call, call.endpoint, self.windows, closed=closed)
        rule = self.plan.draw("chat", call.endpoint.answer_name)
        endpoint = call.endpoint
        if rule.kind == "wrong_provider":
            stray = stray_endpoint(call.endpoints, endpoint, call.chat.provider)
            if stray is None:  # no live endpoint lies outside what the request allows
                return None
            endpoint = stray
        if rule is NO_FAULT:
            return None
        call.traffic.faults[rule.kind] += 1
        return RuleFault(rule, call, endpoint, self.windows)

    def account(self, route: AccountRoute, traffic: Traffic) -> ApiError | None:
        """A `status`/`burst` rule on an accounting route answers in place of the route."""
        rule = self.plan.draw(route)
        if rule is NO_FAULT:
            return None
        traffic.faults[f"{rule.kind}@{route}"] += 1
        return rule.api_error()


@dataclass
class RuleFault:
    """One request's rule, carried out at the server's hook points (eaglepipe/emulator/faults.py's
    `ChatFault`); `closed` is the answer of a rate-limit window still closed over the request."""

    rule: FaultRule
    call: ChatCall
    endpoint: Endpoint
    windows: Windows
    closed: Response | None = None

    @cached_property
    def _error_shape(self) -> shapes.ErrorShape | None:
        return shapes.ERRORS.get(self.rule.shape or "")

    @cached_property
    def _fails_after(self) -> int | None:
        """Where a streamed answer fails with an error chunk (a midstream error, or an error shape)."""
        chunked = self.rule.kind == "midstream_error" or self._error_shape is not None
        return self.rule.after_tokens if chunked else None

    @cached_property
    def _cut_after(self) -> int | None:
        """Where a streamed answer is cut (`cutoff`: the connection breaks; `unfinished`: it ends cleanly)."""
        cut = self.rule.kind == "cutoff" or self.rule.shape == "unfinished"
        return self.rule.after_tokens if cut else None

    @property
    def runs_out(self) -> bool:
        return self._cut_after is not None

    def refuse(self) -> Response | None:
        if self.closed is not None:
            return self.closed
        shape = self._error_shape
        if shape is not None and (self.rule.kind == "burst" or shape.where == "http"):
            return self.windows.shape_error(shape, self.endpoint, self.call.traffic)
        if self.rule.kind in ("status", "burst"):
            raise self.rule.api_error()
        return None

    async def replace(self, completion: Completion, headers: dict[str, str]) -> Response | None:
        rule, chat, traffic = self.rule, self.call.chat, self.call.traffic
        completion.reports_usage = rule.kind != "no_usage"
        completion.reports_cost = rule.kind != "null_cost"
        if rule.shape in _FINISH_STYLES:
            completion.says_finish = finish_saying(rule.shape)
        elif rule.shape == "unfinished":  # a whole answer cut clean says no finish
            completion.says_finish = finish_saying("finish_missing")
        in_200 = self._error_shape
        if rule.kind == "stall" and not chat.stream:
            await asyncio.sleep(rule.seconds)
        elif rule.kind == "reset":
            return dropped_connection(chat.stream, headers)
        elif rule.kind == "empty_choices":
            return empty_answer(chat, completion, headers, self.call.account)
        elif rule.kind == "error_in_200" or (rule.kind == "midstream_error" and not chat.stream):
            return error_answer(chat, completion, headers, traffic)
        elif in_200 is not None and (not chat.stream or in_200.where in ("body", "choice")):
            return error_answer(chat, completion, headers, traffic, in_200)
        elif rule.shape == "no_output":
            return empty_answer(chat, completion, headers, self.call.account, with_choice=True)
        elif rule.shape == "not_json":
            return broken_json(chat, completion, headers)
        return None

    def whole(self, body: ChatCompletion, headers: dict[str, str]) -> Response | None:
        if self.rule.kind == "cutoff":  # billed in full, but the connection breaks after the headers
            return dropped_connection(False, headers)
        if self.rule.shape == "unfinished":  # billed, but the message left empty
            message = {"role": "assistant", "content": "", "refusal": None, "reasoning": None}
            choices = [{**body["choices"][0], "message": message}]
            return JSONResponse({**body, "choices": choices}, headers=headers)
        return None

    async def before_tokens(self) -> AsyncIterator[str]:
        """The `stall` fault: keep-alive comments for `seconds` before the first token."""
        stall_left_s = self.rule.seconds if self.rule.kind == "stall" else 0.0
        while stall_left_s > 0:
            pause_s = min(KEEPALIVE_EVERY_S, stall_left_s)
            await asyncio.sleep(pause_s)
            stall_left_s -= pause_s
            yield PROCESSING

    def after_event(self, completion: Completion) -> StreamFailure | bool:
        fails_after, cut_after = self._fails_after, self._cut_after
        if fails_after is not None and len(completion.tokens) >= fails_after:
            return self._failure(completion)
        return cut_after is not None and len(completion.tokens) >= cut_after

    def after_tokens(self, completion: Completion) -> StreamFailure | bool:
        if self._fails_after is not None:  # the answer ended before the planned failure
            return self._failure(completion)
        if self._cut_after is not None:  # cut here (or at its end, if it ended before the planned cut)
            if self.rule.shape == "unfinished":
                return True  # the body ends cleanly; the provider runs the answer out
            raise InjectedReset("stream cut on purpose (emulator fault injection)")
        return False

    def tail(self, completion: Completion, usual: StreamTail) -> StreamTail:
        tail = self.rule.shape
        if tail == "duplicate_finish":
            return StreamTail([completion.chunk({"content": ""}, finish=True), *usual.chunks])
        if tail == "ended_after_finish":
            return StreamTail([], done=False)
        if tail == "usage_after_finish":
            return StreamTail([{**chunk, "choices": [_REPEATED_CHOICE]} for chunk in usual.chunks])
        return usual

    def _failure(self, completion: Completion) -> StreamFailure:
        """The error chunk a stream fails with: the rule's shape's, else a generic 502."""
        shape = self._error_shape
        status, error = shaped_error(shape, completion.endpoint.answer_name)
        with_choices = shape is None or shape.where != "chunk_no_choices"
        return StreamFailure(status, error_chunk(completion, error, with_choices=with_choices))


def faults_route(emulator: Emulator, seed: int) -> Route:
    """`POST /api/v1/emulator/faults`: a body that is a list of rules, as a `--faults` file holds, replaces
    the plan live (its clock and seed start again, and rate-limit windows it left closed open); 400 with
    the checker's one line for a bad one."""

    async def set_faults(request: Request) -> Response:
        try:
            entries = await request.json()
        except ValueError:
            entries = None
        try:
            plan = fault_plan(entries, seed, "POST /emulator/faults")
        except EmulatorError as exc:
            return error_response(ApiError(400, str(exc), "invalid_request"))
        emulator.faults = PlannedFaults(plan)
        return JSONResponse({"rules": len(plan.rules)})

    return Route("/api/v1/emulator/faults", set_faults, methods=["POST"])
