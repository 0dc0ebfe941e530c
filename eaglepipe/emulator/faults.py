"""The hook for injected failures. The server injects nothing and knows no fault kinds: a `FaultSource`
(the tests' fault plans, tests/support/emulator/fault_source.py) is asked once per request, and the
`ChatFault` it returns is called at fixed points of the answer (app.py, streaming.py), each of which it
may take over or alter. Without a source every request is answered as asked.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from starlette.responses import Response

from eaglepipe.chat_api import ChatCompletion
from eaglepipe.emulator.account import Account, Traffic
from eaglepipe.emulator.chat_request import ChatRequest
from eaglepipe.emulator.completion import Completion
from eaglepipe.emulator.errors import ApiError
from eaglepipe.emulator.providers import Endpoint

AccountRoute = Literal["key", "generation"]


@dataclass(frozen=True)
class ChatCall:
    """What a fault source sees of a chat request once it is checked and routed, and the server state a
    fault may touch (its counts, its bills)."""

    chat: ChatRequest
    endpoint: Endpoint
    endpoints: Sequence[Endpoint]
    traffic: Traffic
    account: Account


@dataclass(frozen=True)
class StreamFailure:
    """Ends a stream with `chunk` (an error chunk), counted as an error of `status`."""

    status: int
    chunk: dict[str, Any]


@dataclass(frozen=True)
class StreamTail:
    """What follows a stream's finish chunk: `chunks` (by default the usage chunk, if the answer reports
    usage), then `[DONE]` unless `done` is off."""

    chunks: list[dict[str, Any]] = field(default_factory=list)
    done: bool = True


class StreamFault(Protocol):
    """What a fault does to a generated stream, at the points `Delivery.events` calls it."""

    @property
    def runs_out(self) -> bool:
        """The provider generates (and bills) the whole answer even if the client's connection ends early."""
        ...

    def before_tokens(self) -> AsyncIterator[str]:
        """Events sent after the opening comment, before the first token (a stall's keep-alives)."""
        ...

    def after_event(self, completion: Completion) -> StreamFailure | bool:
        """After each content event: an error to end with, True to read no more tokens, else False."""
        ...

    def after_tokens(self, completion: Completion) -> StreamFailure | bool:
        """Once no more tokens are read: an error to end with, True to end the body here without a
        finish (or it raises, to break the connection), else False to finish as usual."""
        ...

    def tail(self, completion: Completion, usual: StreamTail) -> StreamTail:
        """What follows the finish chunk, given what usually does."""
        ...


class ChatFault(StreamFault, Protocol):
    """One request's fault, at the points `Emulator` calls it; each may leave the answer as it is."""

    @property
    def endpoint(self) -> Endpoint:
        """The endpoint that serves and bills the answer (a misrouting fault names another)."""
        ...

    def refuse(self) -> Response | None:
        """Before anything is reserved: a response in place of the answer (or it raises `ApiError`)."""
        ...

    async def replace(self, completion: Completion, headers: dict[str, str]) -> Response | None:
        """Before generating: a response in place of the generated answer, else None (it may mark the
        completion: usage, cost, how it says it finished)."""
        ...

    def whole(self, body: ChatCompletion, headers: dict[str, str]) -> Response | None:
        """After a whole (not streamed) answer was generated and billed: a response in place of `body`."""
        ...


class FaultSource(Protocol):
    """Decides each request's fault; None answers it as asked."""

    def chat(self, call: ChatCall) -> ChatFault | None: ...

    def account(self, route: AccountRoute, traffic: Traffic) -> ApiError | None:
        """An error answered in place of an accounting route (`/key`, `/generation`)."""
        ...
