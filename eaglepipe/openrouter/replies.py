"""Reading one chat completion, plain or streamed, into the fields a journal record keeps.

Both paths give the same shape: `content` is a string ("" when none), `reasoning` a string or None,
`tool_calls` a list in the OpenAI shape ([] when none), and `reasoning_details` as the provider sent them
when it did. Providers put the reasoning in `reasoning`, in `reasoning_content` (engines' own field) or
only in `reasoning_details` (`reasoning.text` / `reasoning.summary` items; `reasoning.encrypted` ones are
kept raw and flagged): all three are read. An HTTP 200 that carries an error, has no choices or never says
why it finished is a failure, never a response.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypedDict, cast

import httpx

from eaglepipe.chat_api import ChatRequestBody
from eaglepipe.openrouter.answer_transport import ChatRoute, body_arrived
from eaglepipe.openrouter.errors import error_detail, one_line
from eaglepipe.openrouter.ratelimit import Wait, throttle_wait
from eaglepipe.openrouter.taxonomy import (
    TYPED_STATUS,
    Finish,
    KeptLogprob,
    Observed,
    ReplyAnswer,
    Shape,
    classify,
    judge_finish,
)
from eaglepipe.responses import ReplyFields, ResponseBody


class RequestFailed(Exception):
    """One attempt failed: what was observed (`kind`, `taxonomy.Observed`) and what the server said.

    `status` is the HTTP status, or the code of an error carried inside an HTTP 200 (None for none);
    `code`, `limit_source`, `provider_name`, `raw` and `reason` come from OpenRouter's `error` object, `wait`
    from the wait headers and body (`ratelimit.py`). What the failure means for the run is `shape`, the
    taxonomy's row (`taxonomy.py`), whose name is the failure's class in the summary. `cost`,
    `generation_id` and `provider` are kept when the failed answer reported them, so the ledger can charge it.
    """

    kind: Observed
    detail: str
    status: int | None
    code: str | int | None
    limit_source: str | None
    provider_name: str | None
    raw: str | None
    reason: str | None
    wait: Wait | None
    content_type: str | None
    cost: float | None
    generation_id: str | None
    provider: str | None
    shape: Shape

    def __init__(
        self,
        kind: Observed,
        detail: str,
        *,
        status: int | None = None,
        code: str | int | None = None,
        limit_source: str | None = None,
        provider_name: str | None = None,
        raw: str | None = None,
        reason: str | None = None,
        wait: Wait | None = None,
        content_type: str | None = None,
        cost: float | None = None,
        generation_id: str | None = None,
        provider: str | None = None,
    ) -> None:
        super().__init__(f"HTTP {status}: {detail}" if status is not None else detail)
        self.kind = kind
        self.detail = detail
        self.status = status
        self.code = code
        self.limit_source = limit_source
        self.provider_name = provider_name
        self.raw = raw
        self.reason = reason
        self.wait = wait
        self.content_type = content_type
        self.cost = cost
        self.generation_id = generation_id
        self.provider = provider
        self.shape = classify(self)

    @property
    def error_class(self) -> str:
        return self.shape.name


async def read_reply(
    http: httpx.AsyncClient | ChatRoute,
    body: ChatRequestBody,
    on_started: Callable[[str], Awaitable[None]] | None = None,
) -> ReplyFields:
    """A non-streamed answer, read through httpx's streaming API so that the `X-Generation-Id` header,
    which OpenRouter sends on every answer, is journaled (`on_started`) as soon as the headers arrive:
    a server that sends them before the body (with keep-alive whitespace) lets a cut-off or killed
    request be found in `/generation` as a streamed one would. Where the whole body came with the head
    there is nothing left to cut off, and `on_started` is skipped: the answer's journal record follows at
    once and holds the same id, so a kill in between loses no more than one before `on_started`
    would (and it saves a durable ledger line per answer)."""
    async with http.stream("POST", "chat/completions", json=body) as response:
        generation_id = response.headers.get("x-generation-id")
        if response.status_code == 200 and generation_id and on_started and not body_arrived(response):
            await on_started(generation_id)
        await response.aread()
    if response.status_code != 200:
        raise _http_failure(response)
    try:
        data = response.json()
    except ValueError:
        data = None
    if not isinstance(data, dict):
        generation_id = response.headers.get("x-generation-id")
        raise RequestFailed(
            Observed.NOT_JSON, "HTTP 200 whose body is not a JSON object", generation_id=generation_id
        )
    context = _FailureContext(data.get("id"), data.get("provider"), data.get("usage"))
    if data.get("error"):
        raise context.error_in_body(data["error"])
    choices = data.get("choices") or []
    if not choices:
        raise context.failed("HTTP 200 with no choices", Observed.EMPTY_CHOICES)
    choice = choices[0]
    if choice.get("finish_reason") == "error":
        raise context.error_in_body(choice.get("error") or {})
    message = choice.get("message") or {}
    details = message.get("reasoning_details") or []
    answer: ReplyAnswer = {
        "content": message.get("content") or "",
        "reasoning": message.get("reasoning") or message.get("reasoning_content") or _details_text(details),
        "tool_calls": message.get("tool_calls") or [],
        **_details_fields(details),
    }
    if choice.get("token_ids") is not None:
        answer["token_ids"] = choice["token_ids"]
    # vLLM sends the prefilled prompt's ids at the top level, SGLang in the choice.
    prompt_ids = data.get("prompt_token_ids") or choice.get("prompt_token_ids")
    if prompt_ids is not None:
        answer["prompt_token_ids"] = prompt_ids
    logprobs = _logprob_entries(choice.get("logprobs"))
    if logprobs:
        answer["logprobs"] = {"content": logprobs}
    ending = _Ending(choice.get("finish_reason"), choice.get("native_finish_reason"), True, False, True)
    provider, generation_id, usage = data.get("provider"), data.get("id"), data.get("usage")
    return _record_fields(answer, ending, provider, generation_id, usage, response, body)


def _logprob_entries(logprobs: Any) -> list[KeptLogprob]:
    """Each output token's text, bytes and logprob as sent (`logprobs.content`), without `top_logprobs`:
    the token stage reads exact ids from the bytes; the alternatives would only grow the journal."""
    entries = logprobs.get("content") if isinstance(logprobs, dict) else None
    if not isinstance(entries, list):
        return []
    return [
        {"token": entry.get("token"), "bytes": entry.get("bytes"), "logprob": entry.get("logprob")}
        for entry in entries
        if isinstance(entry, dict)
    ]


EVENT_STREAM = {"Accept": "text/event-stream", "Accept-Encoding": "identity"}


async def read_streamed_reply(
    http: httpx.AsyncClient | ChatRoute,
    body: ChatRequestBody,
    on_started: Callable[[str], Awaitable[None]] | None = None,
) -> ReplyFields:
    """`on_started(generation_id)` is awaited as soon as the id is known (header or first chunk), so a
    request cut off later can still be looked up and charged. The body is asked uncompressed, so that
    `answer_transport`'s wake-up hints (`"error"`, `[DONE]`) can be found in its bytes; with that
    transport the body comes in batches of events."""
    async with http.stream("POST", "chat/completions", json=body, headers=EVENT_STREAM) as response:
        if response.status_code != 200:
            await response.aread()
            raise _http_failure(response)
        stream = _StreamedAnswer(response.headers.get("x-generation-id"))
        if stream.generation_id and on_started:
            await on_started(stream.generation_id)
        events = _EventReader()
        async for piece in response.aiter_bytes():
            await stream.add_events(events.feed(piece), on_started)
            if events.done:
                break
        else:
            await stream.add_events(events.end(), on_started)
        ending = _Ending(
            stream.finish_reason, stream.native_finish_reason, events.done, True, stream.had_choice
        )
        return _record_fields(
            stream.answer(), ending, stream.provider, stream.generation_id, stream.usage, response, body
        )


class _EventReader:
    """Splits an SSE body into the payloads of its events, as bytes, across arbitrary read boundaries.

    As the SSE format says: lines end in LF or CRLF, an event ends at a blank line, its `data:` lines are
    joined with newlines, `:` lines are comments (OpenRouter's keep-alive `: OPENROUTER PROCESSING`), other
    fields are ignored. `[DONE]` ends the stream (`done`); nothing after it is read. A last event that the
    body ends without a blank line still counts. Each `feed` splits a whole read with C calls (one
    `split`), so the per-event Python work is a few comparisons.
    """

    def __init__(self) -> None:
        self._partial = b""  # an unfinished line
        self._data: list[bytes] = []  # the data lines of the event being read
        self.done = False

    def feed(self, piece: bytes) -> list[bytes]:
        if self._partial:
            piece = self._partial + piece
        carry = b""
        if b"\r" in piece:
            if piece.endswith(b"\r"):  # its LF may come with the next read
                piece, carry = piece[:-1], b"\r"
            piece = piece.replace(b"\r\n", b"\n")
        lines = piece.split(b"\n")
        self._partial = lines.pop() + carry
        return self._events(lines)

    def end(self) -> list[bytes]:
        """The body ended: an unfinished last line and event count as finished."""
        lines = [self._partial.rstrip(b"\r"), b""] if self._partial else [b""]
        self._partial = b""
        return self._events(lines)

    def _events(self, lines: list[bytes]) -> list[bytes]:
        payloads: list[bytes] = []
        data = self._data
        for line in lines:
            if not line:
                if data:
                    payload = data[0] if len(data) == 1 else b"\n".join(data)
                    data.clear()
                    if payload == b"[DONE]":
                        self.done = True
                        return payloads
                    payloads.append(payload)
            elif line.startswith(b"data:"):
                data.append(line[6:] if line.startswith(b"data: ") else line[5:])
        return payloads


class _BadEvent(ValueError):
    """An event whose data is not a JSON object; its answer fails (named by `add_events`)."""


def _parsed(payloads: list[bytes]) -> Iterator[dict[str, Any]]:
    """The JSON chunks of a batch of events, parsed in one call (a JSON array of them: the per-call cost
    of `json.loads` is most of a small chunk's). A batch that does not come out as one object per event
    is parsed event by event, yielding the good ones before the bad one raises `_BadEvent`, so a
    generation id it came after is journaled."""
    if not payloads:
        return
    try:
        chunks = json.loads(b"[" + b",".join(payloads) + b"]")
    except ValueError:
        chunks = None
    if chunks is not None and len(chunks) == len(payloads) and all(type(chunk) is dict for chunk in chunks):
        yield from chunks
        return
    for payload in payloads:
        try:
            chunk = json.loads(payload)
        except ValueError:
            raise _BadEvent("stream sent a data line that is not JSON") from None
        if not isinstance(chunk, dict):
            raise _BadEvent("stream sent a data line that is not a JSON object")
        yield chunk


class _FailureContext:
    """What a failed answer said about itself, carried into its RequestFailed for the ledger."""

    def __init__(self, generation_id: str | None, provider: str | None, usage: dict[str, Any] | None) -> None:
        self.generation_id = generation_id
        self.provider = provider
        self.cost = (usage or {}).get("cost")

    def failed(self, detail: str, kind: Observed) -> RequestFailed:
        return RequestFailed(
            kind, detail, cost=self.cost, generation_id=self.generation_id, provider=self.provider
        )

    def error_in_body(self, error: Any) -> RequestFailed:
        """An error inside an HTTP 200 keeps its own code, so a 402 mid-stream still stops the run and a
        429 there is still throttling."""
        if not isinstance(error, dict):
            return self.failed(f"error inside an HTTP 200: {one_line(str(error))}", Observed.ERROR_IN_200)
        fields = _ErrorFields(error)
        message = one_line(str(error.get("message") or error))
        return RequestFailed(
            Observed.ERROR_IN_200,
            f"error inside an HTTP 200: {message}{fields.note()}",
            **fields.metadata(),
            status=fields.status,
            wait=throttle_wait({}, error),
            cost=self.cost,
            generation_id=self.generation_id,
            provider=self.provider,
        )


class _StreamedAnswer:
    """Accumulates the deltas of choice 0; usage arrives in the last chunk, with empty choices."""

    def __init__(self, generation_id: str | None) -> None:
        self.content: list[str] = []
        self.reasoning: list[str] = []
        self.reasoning_content: list[str] = []
        self.reasoning_details: list[dict[str, Any]] = []
        self.tool_calls: list[dict[str, Any]] = []
        self._call_by_id: dict[str, dict[str, Any]] = {}
        self._call_at_index: dict[int, dict[str, Any]] = {}
        self.token_ids: list[int] | None = None
        self.prompt_token_ids: list[int] | None = None
        self.logprobs: list[KeptLogprob] = []
        self.finish_reason: str | None = None
        self.native_finish_reason: str | None = None
        self.had_choice = False
        self.provider: str | None = None
        self.generation_id = generation_id
        self.usage: dict[str, Any] | None = None

    def context(self) -> _FailureContext:
        return _FailureContext(self.generation_id, self.provider, self.usage)

    async def add_events(
        self, payloads: list[bytes], on_started: Callable[[str], Awaitable[None]] | None
    ) -> None:
        """Adds a batch of events in order; the first id seen is journaled before any later chunk (an
        error chunk among them included) is read."""
        try:
            for chunk in _parsed(payloads):
                first_id = self.generation_id is None and chunk.get("id")
                self.add(chunk)
                if first_id and on_started:
                    await on_started(first_id)
        except _BadEvent as bad:
            raise self.context().failed(str(bad), Observed.NOT_JSON) from None

    def add(self, chunk: dict[str, Any]) -> None:
        self.generation_id = self.generation_id or chunk.get("id")
        self.provider = self.provider or chunk.get("provider")
        self.usage = chunk.get("usage") or self.usage
        self.prompt_token_ids = self.prompt_token_ids or chunk.get("prompt_token_ids")  # vLLM: first chunk
        if chunk.get("error"):
            raise self.context().error_in_body(chunk["error"])
        for choice in chunk.get("choices") or ():
            if choice.get("index", 0) != 0:
                continue
            self.had_choice = True
            finish_reason = choice.get("finish_reason")
            if finish_reason == "error":
                raise self.context().error_in_body(choice.get("error") or {})
            delta = choice.get("delta")
            if delta:  # each field looked at only when sent: this runs once per token
                if text := delta.get("content"):
                    self.content.append(text)
                if text := delta.get("reasoning"):
                    self.reasoning.append(text)
                if text := delta.get("reasoning_content"):
                    self.reasoning_content.append(text)
                for item in delta.get("reasoning_details") or ():
                    self._add_reasoning_detail(item)
                for call in delta.get("tool_calls") or ():
                    self._add_tool_call(call)
            if choice.get("token_ids") is not None:
                self.token_ids = (self.token_ids or []) + list(choice["token_ids"])
            if logprobs := choice.get("logprobs"):
                self.logprobs += _logprob_entries(logprobs)
            self.finish_reason = finish_reason or self.finish_reason
            self.native_finish_reason = choice.get("native_finish_reason") or self.native_finish_reason

    def _add_tool_call(self, fragment: dict[str, Any]) -> None:
        """Id, type and name come once; the arguments string arrives in pieces. A fragment with an id
        belongs to that call: some providers send parallel calls all at index 0, each with its own id.
        One without an id continues the call last started at its index (OpenAI's shape)."""
        index, call_id = fragment.get("index", 0), fragment.get("id")
        call = self._call_by_id.get(call_id) if call_id else self._call_at_index.get(index)
        if call is None:
            call = {"id": None, "type": "function", "function": {"name": "", "arguments": ""}}
            self.tool_calls.append(call)
            if call_id:
                self._call_by_id[call_id] = call
        self._call_at_index[index] = call
        call["id"] = call_id or call["id"]
        call["type"] = fragment.get("type") or call["type"]
        function = fragment.get("function") or {}
        call["function"]["name"] = function.get("name") or call["function"]["name"]
        call["function"]["arguments"] += function.get("arguments") or ""

    def _add_reasoning_detail(self, item: Any) -> None:
        """Streamed items arrive in pieces: one with the `index` and type of the last continues it."""
        if not isinstance(item, dict):
            return
        last = self.reasoning_details[-1] if self.reasoning_details else None
        continues = last is not None and "index" in item and last.get("index") == item.get("index")
        if last is None or not (continues and last.get("type") == item.get("type")):
            self.reasoning_details.append(dict(item))
            return
        for key in ("text", "summary", "data"):
            if isinstance(item.get(key), str):
                last[key] = (last.get(key) or "") + item[key]

    def answer(self) -> ReplyAnswer:
        answer: ReplyAnswer = {
            "content": "".join(self.content),
            "reasoning": "".join(self.reasoning)
            or "".join(self.reasoning_content)
            or _details_text(self.reasoning_details),
            "tool_calls": self.tool_calls,
            **_details_fields(self.reasoning_details),
        }
        if self.token_ids is not None:
            answer["token_ids"] = self.token_ids
        if self.prompt_token_ids is not None:
            answer["prompt_token_ids"] = self.prompt_token_ids
        if self.logprobs:
            answer["logprobs"] = {"content": self.logprobs}
        return answer


def _details_text(details: list[Any]) -> str | None:
    """The readable reasoning of `reasoning_details`: text and summary items, in order."""
    parts = []
    for item in details:
        if isinstance(item, dict) and item.get("type") == "reasoning.text":
            parts.append(str(item.get("text") or ""))
        elif isinstance(item, dict) and item.get("type") == "reasoning.summary":
            parts.append(str(item.get("summary") or ""))
    return "".join(parts) or None


class _DetailsFields(TypedDict, total=False):
    reasoning_details: list[Any]
    reasoning_encrypted: bool


def _details_fields(details: list[Any]) -> _DetailsFields:
    """`reasoning_details` as sent, and a flag when part of the reasoning is encrypted (its tokens were
    billed but cannot be rebuilt)."""
    if not details:
        return {}
    fields: _DetailsFields = {"reasoning_details": details}
    if any(isinstance(item, dict) and item.get("type") == "reasoning.encrypted" for item in details):
        fields["reasoning_encrypted"] = True
    return fields


_NO_ANSWER = {
    Observed.CONTENT_FILTER: "the provider's content filter ended the answer",
    Observed.ERROR_IN_200: "the answer's native finish reason is an error",
    Observed.NO_OUTPUT: "the answer finished with nothing in it",
    Observed.UNFINISHED: "the answer ended without any sign that it finished",
}


@dataclass(frozen=True)
class _Ending:
    """How the reply said it ended: its finish reasons, whether it ended whole (`[DONE]`, or a whole
    plain body), whether it was streamed, and whether any choice came at all (a stream of chunks with
    empty `choices` is the streamed form of an HTTP 200 without choices)."""

    finish_reason: Any
    native_finish_reason: Any
    whole: bool
    streamed: bool
    had_choice: bool


def _record_fields(
    answer: ReplyAnswer,
    ending: _Ending,
    provider: str | None,
    generation_id: str | None,
    usage: dict[str, Any] | None,
    response: httpx.Response,
    body: ChatRequestBody,
) -> ReplyFields:
    """The journal's fields of a reply judged complete (`taxonomy.judge_finish`); else the failure."""
    usage = usage or {}
    generation_id = generation_id or response.headers.get("x-generation-id")
    finish = judge_finish(
        ending.finish_reason,
        ending.native_finish_reason,
        ended_whole=ending.whole,
        streamed=ending.streamed,
        answer=answer,
        completion_tokens=usage.get("completion_tokens"),
        max_tokens=body.get("max_tokens"),
    )
    if not isinstance(finish, Finish):
        context = _FailureContext(generation_id, provider, usage)
        if not ending.had_choice:
            raise context.failed("HTTP 200 with no choices", Observed.EMPTY_CHOICES)
        raise context.failed(_NO_ANSWER[finish], finish)
    details = usage.get("completion_tokens_details") or {}
    # `answer` holds the text, tool calls and whichever ids, logprobs and details the server sent.
    answered = cast(ResponseBody, {**answer, "finish_reason": finish.reason, **finish.evidence()})
    return {
        "response": answered,
        "provider": provider,
        "generation_id": generation_id,
        "usage": {
            "prompt_tokens": usage.get("prompt_tokens"),
            "completion_tokens": usage.get("completion_tokens"),
            "reasoning_tokens": details.get("reasoning_tokens") or 0,
            "cost": usage.get("cost"),
        },
    }


def _http_failure(response: httpx.Response) -> RequestFailed:
    try:
        error = response.json().get("error")
    except (ValueError, AttributeError):
        error = None
    fields = _ErrorFields(error if isinstance(error, dict) else {})
    return RequestFailed(
        Observed.HTTP,
        error_detail(response) + fields.note() + fields.provider_note(),
        status=response.status_code,
        **fields.metadata(),
        wait=throttle_wait(response.headers, error),
        content_type=response.headers.get("content-type"),
    )


class _FailureFields(TypedDict):
    """What RequestFailed keeps of an `error` object."""

    code: str | int | None
    limit_source: str | None
    provider_name: str | None
    raw: str | None
    reason: str | None


class _ErrorFields:
    """OpenRouter's `error` object: `code` may be a number, a numeric string ("402") or a name
    ("weight_exceeds_budget"); `metadata` may hold `limit_source`, `provider_name`, `raw`, `reason`."""

    def __init__(self, error: dict[str, Any]) -> None:
        code = error.get("code")
        self.code: str | int | None = None if isinstance(code, bool) else code
        metadata = error.get("metadata")
        self.meta: dict[str, Any] = metadata if isinstance(metadata, dict) else {}
        availability = error.get("availability")
        self.availability: dict[str, Any] = availability if isinstance(availability, dict) else {}
        self.status = _status_of(self.code, error.get("http_status"), self.meta.get("error_type"),
                                 error.get("error_type"))

    def metadata(self) -> _FailureFields:
        raw = self.meta.get("raw")
        return {
            "code": self.code,
            "limit_source": _text(self.meta.get("limit_source")),
            "provider_name": _text(self.meta.get("provider_name")),
            "raw": one_line(raw if isinstance(raw, str) else json.dumps(raw)) if raw is not None else None,
            "reason": (
                _text(self.meta.get("reason")) or _text(self.availability.get("code")) or _text(self.code)
            ),
        }

    def note(self) -> str:
        """A budget limit's figures, so the stop line says which limit and how far it is from reset."""
        meta = self.meta
        parts = [f"{key} {meta[key]}" for key in ("limit_usd", "spend_usd", "resets_at") if meta.get(key)]
        if not (meta.get("limit_source") and parts):
            return ""
        return f" ({meta['limit_source']}: {', '.join(parts)})"

    def provider_note(self) -> str:
        """A provider's own error text (`metadata.raw`), which says more than OpenRouter's wrapper line."""
        name, raw = _text(self.meta.get("provider_name")), self.meta.get("raw")
        if not name:
            return ""
        return f" [{name}: {one_line(str(raw))[:200]}]" if raw else f" [{name}]"


def _status_of(code: Any, *typed: Any) -> int | None:
    """The HTTP status an error stands for: a numeric `code` ("402" too), an `http_status`, else its type
    (`error_type`, or a string code such as "server_error") by the taxonomy's TYPED_STATUS."""
    if isinstance(code, int) and not isinstance(code, bool):
        return code
    if isinstance(code, str) and code.isdigit():
        return int(code)
    for value in (*typed, code):
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, str) and value in TYPED_STATUS:
            return TYPED_STATUS[value]
    return None


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None
