"""An HTTP/1.1 transport for chat completions, below httpx, that reads a streamed answer's connection a
few times a second rather than once per event.

Why: a streamed answer arrives one small chunk per token, and reading each through httpcore, h11 and anyio
was most of the client's CPU. Here an asyncio `BufferedProtocol` decodes the body as bytes arrive, the
socket rests `REST_S` unread after each read of an event stream (the first event, which carries the
generation id, is read at once), and the reader is woken only when it has work: the first event, every
`BATCH_BYTES`, an `URGENT` marker, the end, a failure. Only `POST .../chat/completions` comes here, the rest
through `fallback` (everything, where a proxy from the environment serves the URL); failures are httpx's
own exceptions, never holding a header (the API key's). How it was measured: docs/generation.md, "Benchmark".
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import ssl
import urllib.parse
import urllib.request
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any, cast

import httpx

ROUTE = "/chat/completions"
BATCH_BYTES = 16384
URGENT = (b'"error"', b"[DONE]")
MAX_HEAD_BYTES = 65536
MAX_LINE_BYTES = 4096  # a chunk-size or trailer line longer than this is no HTTP/1.1 a server sends
_HEX = re.compile(rb"[0-9A-Fa-f]{1,16}")  # a chunk size as RFC 9112 spells it (int() takes more: +, _, 0x)
_MARKER_REACH = max(len(marker) for marker in URGENT) - 1  # bytes of a marker a read can end with
REST_S = 0.5  # after each read of a body, the socket is left unread this long (module docstring)
DRAIN_S = 2 * REST_S  # how long a connection whose reader stopped early may take to finish its body
READ_BUFFER_BYTES = 1 << 18  # what one read takes at most, as asyncio's own reads
PAUSE_BYTES = 1 << 20  # a reader this far behind stops the socket's reads until it catches up
BODY_ARRIVED = "eaglepipe.body_arrived"  # the response extension `body_arrived` reads


def body_arrived(response: httpx.Response) -> bool:
    """Whether the whole body had arrived with the response's head (False where unknown: httpx's own
    transport): then nothing is left to be cut off between the two."""
    return bool(response.extensions.get(BODY_ARRIVED))


def answer_transport(base_url: str, ssl_context: ssl.SSLContext, connections: int) -> AnswerTransport | None:
    """The transport for an httpx client of `connections` kept-alive connections to `base_url`; None
    where a proxy from the environment serves that URL (httpx honours those only with its own transport,
    which then reads streams too)."""
    url = urllib.parse.urlsplit(base_url)
    proxies = urllib.request.getproxies()
    proxy = proxies.get(url.scheme) or proxies.get("all")
    if proxy and not urllib.request.proxy_bypass(url.hostname or ""):
        return None
    limits = httpx.Limits(max_connections=connections, max_keepalive_connections=connections)
    fallback = httpx.AsyncHTTPTransport(verify=ssl_context, limits=limits)
    return AnswerTransport(fallback, ssl_context, keep_alive=connections)


class ChatRoute:
    """`POST chat/completions` of one httpx client, handed straight to its `AnswerTransport`, past httpx's
    client layer (URL and header merging, the auth and redirect flows, cookie extraction on every
    response: about 0.15 ms of CPU per request, as much as the transport's own work on a plain answer).
    Without such a transport (a proxy) the client does everything. It offers httpx's `stream`, so the
    readers take a route or a client alike (the transport itself sends other routes on through httpx's);
    the client stays `http`, for the rest."""

    def __init__(self, http: httpx.AsyncClient, transport: AnswerTransport | None) -> None:
        self.http = http
        self._transport = transport
        self._timeout = http.timeout.as_dict()
        self._templates: dict[tuple[str, str, tuple[tuple[str, str], ...]], httpx.Request] = {}

    @contextlib.asynccontextmanager
    async def stream(
        self, method: str, url: str, *, json: Any, headers: Mapping[str, str] | None = None
    ) -> AsyncIterator[httpx.Response]:
        if self._transport is None:
            async with self.http.stream(method, url, json=json, headers=headers) as response:
                yield response
            return
        template = self._template(method, url, headers)
        request = httpx.Request(
            method, template.url, headers=template.headers, json=json, extensions={"timeout": self._timeout}
        )
        response = await self._transport.handle_async_request(request)
        try:
            yield response
        finally:
            await response.aclose()

    def _template(self, method: str, url: str, headers: Mapping[str, str] | None) -> httpx.Request:
        """The URL and headers httpx's client would send, merged once per request shape."""
        key = (method, url, tuple(headers.items()) if headers else ())
        template = self._templates.get(key)
        if template is None:
            template = self.http.build_request(method, url, headers=headers)
            for name in ("content-length", "transfer-encoding", "content-type"):
                template.headers.pop(name, None)
            self._templates[key] = template
        return template


class AnswerTransport(httpx.AsyncBaseTransport):
    """Chat completions over this module's connections; all other requests through `fallback`. The read
    timeout is httpx's, the longest gap between two reads (a rest counts as reading). Connections are kept
    alive and reused per origin, LIFO, at most `keep_alive` idle; their number is bounded by the callers'
    workers, one request each."""

    def __init__(
        self, fallback: httpx.AsyncBaseTransport, ssl_context: ssl.SSLContext | None, keep_alive: int
    ) -> None:
        self._fallback = fallback
        self._ssl = ssl_context
        self._keep_alive = keep_alive
        self._idle: dict[tuple[bytes, bytes, int], list[_Connection]] = {}
        self._closed = False
        self._read_buffer = memoryview(bytearray(READ_BUFFER_BYTES))

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if request.method != "POST" or not request.url.path.endswith(ROUTE):
            return await self._fallback.handle_async_request(request)
        timeouts = request.extensions.get("timeout") or {}
        url = request.url
        origin = (url.raw_scheme, url.raw_host, url.port or (443 if url.raw_scheme == b"https" else 80))
        assert isinstance(request.stream, httpx.AsyncByteStream)  # as httpx's own async transports assert
        body = b"".join([part async for part in request.stream])
        connection = self._idle_connection(origin) or await self._connect(origin, timeouts.get("connect"))
        head = [request.method.encode(), b" ", url.raw_path, b" HTTP/1.1\r\n"]
        for name, value in request.headers.raw:
            head += [name, b": ", value, b"\r\n"]
        if "content-length" not in request.headers and "transfer-encoding" not in request.headers:
            head.append(b"Content-Length: %d\r\n" % len(body))
        try:
            connection.send(b"".join([*head, b"\r\n", body]))
            await connection.wait_for(lambda: connection.head is not None, timeouts.get("read"))
        except BaseException:
            connection.close()
            raise
        assert connection.head is not None  # what wait_for waited for
        status, reason, headers = connection.head
        return httpx.Response(
            status,
            headers=headers,
            stream=_Body(connection, self, origin, timeouts.get("read")),
            extensions={
                "http_version": b"HTTP/1.1",
                "reason_phrase": reason,
                BODY_ARRIVED: connection.complete,
            },
            request=request,
        )

    def _idle_connection(self, origin: tuple[bytes, bytes, int]) -> _Connection | None:
        idle = self._idle.get(origin) or []
        while idle:
            connection = idle.pop()
            if connection.reusable():
                connection.reset()
                return connection
            connection.close()
        return None

    def release(self, origin: tuple[bytes, bytes, int], connection: _Connection) -> None:
        """Back to the pool, or closed: a connection that finished draining after `aclose` is closed."""
        idle = self._idle.setdefault(origin, [])
        if connection.reusable() and len(idle) < self._keep_alive and not self._closed:
            idle.append(connection)
        else:
            connection.close()

    async def _connect(self, origin: tuple[bytes, bytes, int], timeout: float | None) -> _Connection:
        scheme, host, port = origin
        tls = (self._ssl or ssl.create_default_context()) if scheme == b"https" else None
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(timeout):
                _, connection = await loop.create_connection(
                    lambda: _Connection(loop, self._read_buffer), host.decode("ascii"), port, ssl=tls
                )
        except TimeoutError:
            raise httpx.ConnectTimeout("timed out connecting") from None
        except OSError as error:  # refused, unreachable, DNS, TLS (ssl.SSLError is an OSError)
            raise httpx.ConnectError(str(error)) from None
        return connection

    async def aclose(self) -> None:
        self._closed = True
        for idle in self._idle.values():
            for connection in idle:
                connection.close()
        self._idle.clear()
        await self._fallback.aclose()


class _Body(httpx.AsyncByteStream):
    """The response body in the pieces the connection gathered; the connection goes back to the pool
    once the body has been read to its end (`aclose`: also when the reader stopped just before it)."""

    def __init__(
        self,
        connection: _Connection,
        transport: AnswerTransport,
        origin: tuple[bytes, bytes, int],
        read_timeout: float | None,
    ) -> None:
        self._connection = connection
        self._transport = transport
        self._origin = origin
        self._read_timeout = read_timeout
        self._open = True

    async def __aiter__(self) -> AsyncIterator[bytes]:
        connection = self._connection
        while True:
            if connection.body:
                yield connection.take()
            elif connection.complete:
                break
            elif connection.error is not None:
                raise connection.error
            else:
                await connection.wait_for(connection.ready, self._read_timeout)
        self._open = False
        self._transport.release(self._origin, connection)

    async def aclose(self) -> None:
        """A reader that stops at `[DONE]` leaves the body's last bytes (the closing chunk) on their way:
        the connection goes back to the pool when they arrive, and is closed if they do not soon."""
        if self._open:
            self._open = False
            self._connection.release_when_complete(
                lambda: self._transport.release(self._origin, self._connection), DRAIN_S
            )


_HEAD, _CHUNK_SIZE, _CHUNK_DATA, _CHUNK_END, _TRAILER, _LENGTH, _UNTIL_CLOSE, _DONE = range(8)


class _Connection(asyncio.BufferedProtocol):
    """One HTTP/1.1 connection: parses the response head and decodes the body in `data_received`,
    gathering body bytes in `body` until the reader is due a wake-up (see the module docstring).

    Reads go into `buffer`, one per transport shared by its connections (a read is copied out before the
    next can start): a plain `Protocol` gets each read as a new 256 KiB bytes object, which malloc
    serves with an mmap and munmap per read."""

    def __init__(self, loop: asyncio.AbstractEventLoop, buffer: memoryview) -> None:
        self._loop = loop
        self._buffer = buffer
        self._transport: asyncio.Transport | None = None
        self._resting = False
        self.lost = False
        self.reset()

    def reset(self) -> None:
        """Ready for the next response on this connection."""
        self.head: tuple[int, bytes, list[tuple[bytes, bytes]]] | None = None
        self.body: list[bytes] = []
        self.body_bytes = 0
        self.event_stream = False  # an SSE body: read in rests once its first event is handed over
        self.eager = True  # until the first event has been handed over
        self.complete = False
        self.keep_alive = True
        self.error: Exception | None = None
        self._state = _HEAD
        self._pending = b""
        self._tail = b""  # the last bytes of the previous read's body: a marker may straddle two reads
        self._remaining = 0
        self._waiter: asyncio.Future[None] | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._on_complete: Callable[[], None] | None = None
        self._drain_timer: asyncio.TimerHandle | None = None
        self.last_read = self._loop.time()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # asyncio types every protocol's transport as a BaseTransport; a stream connection's is a Transport.
        self._transport = cast(asyncio.Transport, transport)

    def send(self, data: bytes) -> None:
        """The request; the read timeout runs from here (not from the connect or the TLS handshake)."""
        assert self._transport is not None
        self._transport.write(data)
        self.last_read = self._loop.time()

    def reusable(self) -> bool:
        return (
            self.complete
            and self.keep_alive
            and not self.lost
            and not self._pending
            and self._transport is not None
            and not self._transport.is_closing()
        )

    def close(self) -> None:
        self.lost = True
        if self._transport is not None:
            self._transport.close()

    def release_when_complete(self, release: Callable[[], None], within_s: float) -> None:
        if self.complete:
            release()
        elif self.head is None or self.error is not None or self.lost:
            self.close()
        else:
            self._on_complete = release
            self._drain_timer = self._loop.call_later(within_s, self._drain_timeout)

    def _drain_timeout(self) -> None:
        self._on_complete = None
        self.close()

    def take(self) -> bytes:
        data = b"".join(self.body) if len(self.body) > 1 else self.body[0]
        self.body.clear()
        self.body_bytes = 0
        return data

    def ready(self) -> bool:
        return bool(self.body) or self.complete or self.error is not None

    async def wait_for(self, condition: Callable[[], bool], timeout: float | None) -> None:
        """Until `condition()` holds or the connection fails; ReadTimeout after `timeout` s without bytes."""
        while not condition():
            if self.error is not None:
                raise self.error
            self._waiter = self._loop.create_future()
            if timeout is not None:
                self._timer = self._loop.call_at(self.last_read + timeout, self._idle, timeout)
            try:
                await self._waiter
            finally:
                self._waiter = None
                if self._timer is not None:
                    self._timer.cancel()
                    self._timer = None

    def _idle(self, timeout: float) -> None:
        """The read timer: fails the connection once `timeout` s passed without bytes, else re-arms."""
        if self._resting:
            self._timer = self._loop.call_later(REST_S, self._idle, timeout)
        elif self._loop.time() - self.last_read >= timeout:
            self._fail(httpx.ReadTimeout("timed out reading the response"))
        else:
            self._timer = self._loop.call_at(self.last_read + timeout, self._idle, timeout)

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def get_buffer(self, sizehint: int) -> memoryview:
        return self._buffer

    def buffer_updated(self, nbytes: int) -> None:
        self.data_received(self._buffer[:nbytes].tobytes())

    def data_received(self, data: bytes) -> None:
        self.last_read = self._loop.time()
        try:
            added = self._parse(self._pending + data if self._pending else data)
        except httpx.RemoteProtocolError as error:
            self._fail(error)
            return
        if self.head is None:
            return
        if self._waiter is not None:
            if self.complete or self.body_bytes >= BATCH_BYTES:
                self._wake()
            elif added is not None:
                if self.eager:
                    self.eager = not self.event_stream or b"data:" not in added
                    self._wake()
                elif any(m in added or m in self._tail + added[: len(m) - 1] for m in URGENT):
                    self._wake()
        if added is not None:
            self._tail = added[-_MARKER_REACH:]
        if not (self.eager or self.complete or self._resting or self._transport is None):
            self._resting = True
            self._transport.pause_reading()
            self._loop.call_later(REST_S, self._end_rest)

    def _end_rest(self) -> None:
        """Reads again what came meanwhile; a reader `PAUSE_BYTES` behind gets another rest first.
        Time at rest counts as reading for the read timeout."""
        if self.body_bytes >= PAUSE_BYTES and not self.lost:
            self._loop.call_later(REST_S, self._end_rest)
            return
        self._resting = False
        self.last_read = self._loop.time()
        if self._transport is not None:
            self._transport.resume_reading()

    def _parse(self, data: bytes) -> bytes | None:
        """Consumes `data`; returns the body bytes it added (for the wake-up hints), keeps a partial
        line or head in `_pending`."""
        position, size = 0, len(data)
        added: list[bytes] = []
        while position < size:
            state = self._state
            if state == _CHUNK_SIZE:
                position = self._whole_chunks(data, position, added)
                if self._state != _CHUNK_SIZE or position >= size:
                    continue
                # a partial chunk, or a size line with an extension: step by step
                end = data.find(b"\r\n", position)
                if end == -1:
                    _check_line_length(size - position)
                    break
                size_field = data[position:end].split(b";", 1)[0].rstrip(b" \t")
                if not _HEX.fullmatch(size_field):
                    raise httpx.RemoteProtocolError("malformed chunk size in the response body")
                self._remaining = int(size_field, 16)
                position = end + 2
                self._state = _CHUNK_DATA if self._remaining else _TRAILER
            elif state in (_CHUNK_DATA, _LENGTH):
                end = min(size, position + self._remaining)
                added.append(data[position:end])
                self._remaining -= end - position
                position = end
                if not self._remaining:
                    self._state = _CHUNK_END if state == _CHUNK_DATA else self._finish()
            elif state == _CHUNK_END:
                if size - position < 2:
                    break
                if data[position : position + 2] != b"\r\n":
                    raise httpx.RemoteProtocolError("a body chunk not followed by CRLF")
                position += 2
                self._state = _CHUNK_SIZE
            elif state == _TRAILER:
                end = data.find(b"\r\n", position)
                if end == -1:
                    _check_line_length(size - position)
                    break
                self._state = _TRAILER if end > position else self._finish()
                position = end + 2
            elif state == _HEAD:
                end = data.find(b"\r\n\r\n", position)
                if end == -1:
                    if size - position > MAX_HEAD_BYTES:
                        raise httpx.RemoteProtocolError("response head too long")
                    break
                self._read_head(data[position:end])
                position = end + 4
            elif state == _UNTIL_CLOSE:
                added.append(data[position:] if position else data)
                position = size
            else:  # _DONE: bytes after a complete response on a connection we did not reuse yet
                self.keep_alive = False
                position = size
        self._pending = data[position:] if position < size else b""
        if not added:
            return None
        piece = added[0] if len(added) == 1 else b"".join(added)
        if piece:
            self.body.append(piece)
            self.body_bytes += len(piece)
        return piece

    def _whole_chunks(self, data: bytes, position: int, added: list[bytes]) -> int:
        """Decodes the whole chunks from `position` in one loop (no state change per chunk: a read holds
        a rest's worth of events, one chunk each); returns where the first incomplete one starts, or past
        the last chunk (`_TRAILER`)."""
        find, size = data.find, len(data)
        while True:
            end = find(b"\r\n", position)
            if end == -1:
                return position
            if not _HEX.fullmatch(data, position, end):  # an extension, or malformed: step by step
                return position
            length = int(data[position:end], 16)
            if not length:
                self._state = _TRAILER
                return end + 2
            stop = end + 2 + length
            if stop + 2 > size:
                return position
            if data[stop : stop + 2] != b"\r\n":
                raise httpx.RemoteProtocolError("a body chunk not followed by CRLF")
            added.append(data[end + 2 : stop])
            position = stop + 2

    def _read_head(self, head: bytes) -> None:
        lines = head.split(b"\r\n")
        parts = lines[0].split(b" ", 2)
        try:
            version, status = parts[0], int(parts[1])
        except (IndexError, ValueError):
            raise httpx.RemoteProtocolError(f"malformed status line {lines[0][:80]!r}") from None
        if 100 <= status < 200:  # an interim answer (100 Continue): the real head follows
            return
        headers = []
        for line in lines[1:]:
            name, colon, value = line.partition(b":")
            if not colon:
                raise httpx.RemoteProtocolError("malformed response header line")
            headers.append((name.strip(), value.strip()))
        fields = {name.lower(): value.lower() for name, value in headers}
        lengths = {value for name, value in headers if name.lower() == b"content-length"}
        self.event_stream = b"text/event-stream" in fields.get(b"content-type", b"")
        self.keep_alive = version == b"HTTP/1.1" and b"close" not in fields.get(b"connection", b"")
        reason = parts[2] if len(parts) > 2 else b""
        self.head = (status, reason, headers)
        if status in (204, 304):
            self._state = self._finish()
        elif b"chunked" in fields.get(b"transfer-encoding", b""):
            self._state = _CHUNK_SIZE
            if lengths:  # both framings: chunked wins, and the connection is not trusted again
                self.keep_alive = False
        elif lengths:
            (length,) = lengths if len(lengths) == 1 else (b"",)
            if not length.isdigit():
                raise httpx.RemoteProtocolError("malformed or conflicting Content-Length")
            self._remaining = int(length)
            self._state = _LENGTH if self._remaining else self._finish()
        else:
            self.keep_alive = False
            self._state = _UNTIL_CLOSE
        if self._waiter is not None:
            self._wake()

    def _finish(self) -> int:
        self.complete = True
        if self._on_complete is not None:
            assert self._drain_timer is not None
            self._drain_timer.cancel()
            self._loop.call_soon(self._on_complete)  # once this read is parsed: `release` checks it
            self._on_complete = None
        return _DONE

    def eof_received(self) -> bool:
        self._closed(None)
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self._closed(exc)

    def _closed(self, exc: Exception | None) -> None:
        self.lost = True
        if self.complete or self.error is not None:
            return
        if self._state == _UNTIL_CLOSE:
            self.complete = True
        elif exc is not None:
            self._fail(httpx.ReadError(f"connection lost: {exc}"))
        elif self.head is None:
            self._fail(httpx.RemoteProtocolError("Server disconnected without sending a response."))
        else:
            self._fail(httpx.RemoteProtocolError("peer closed connection before the end of the body"))
        self._wake()

    def _fail(self, error: Exception) -> None:
        self.error = error
        self.lost = True
        if self._transport is not None:
            self._transport.close()
        self._wake()


def _check_line_length(pending: int) -> None:
    if pending > MAX_LINE_BYTES:
        raise httpx.RemoteProtocolError("a chunk-size or trailer line too long in the response body")
