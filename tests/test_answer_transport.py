"""The streamed path below httpx: the SSE event splitter on every split of a body, and the event-stream
transport against a raw HTTP/1.1 server on loopback that writes its bytes in pieces, pauses, breaks off
and resets, as real connections do."""

from __future__ import annotations

import asyncio
import datetime
import json
import socket
import ssl
import struct
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from eaglepipe.openrouter.answer_transport import BATCH_BYTES, ChatRoute, answer_transport
from eaglepipe.openrouter.replies import RequestFailed, _EventReader, read_reply, read_streamed_reply

SECRET = "sk-or-v1-TESTSECRET0123456789"


def event(payload: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(payload).encode() + b"\n\n"


def content_chunk(text: str, finish: str | None = None, **extra: Any) -> dict[str, Any]:
    choice = {"index": 0, "delta": {"content": text}, "finish_reason": finish}
    return {"id": "gen-t", "provider": "Fake", "choices": [choice], **extra}


USAGE_CHUNK = {
    "id": "gen-t",
    "choices": [],
    "usage": {"prompt_tokens": 3, "completion_tokens": 2, "cost": 0.002},
}


def test_events_split_the_same_at_every_read_boundary() -> None:
    body = (
        b": OPENROUTER PROCESSING\r\n\r\n"
        b'data: {"a": 1}\r\n\r\n'
        b"event: ignored\n"
        b'data: {"b":\n'
        b"data: 2}\n"
        b"id: 7\n\n"
        b": OPENROUTER PROCESSING\n\n"
        b'data:{"c": 3}\n\n'
        b"data: [DONE]\n\n"
        b'data: {"after": "done"}\n\n'
    )
    expected = [b'{"a": 1}', b'{"b":\n2}', b'{"c": 3}']
    for first in range(len(body) + 1):
        for second in range(first, len(body) + 1, 7):
            reader = _EventReader()
            payloads = []
            for piece in (body[:first], body[first:second], body[second:]):
                if not reader.done:
                    payloads += reader.feed(piece)
            assert payloads == expected and reader.done, (first, second)


def test_a_last_event_without_its_blank_line_still_counts() -> None:
    reader = _EventReader()
    assert reader.feed(b'data: {"a": 1}\r\n\r\ndata: {"b"') == [b'{"a": 1}']
    assert reader.feed(b": 2}\r") == []
    assert reader.end() == [b'{"b": 2}'] and not reader.done


Script = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


class RawServer:
    """An HTTP/1.1 server on loopback that answers each request with the next script; counts connections
    and keeps the requests' heads."""

    def __init__(self, scripts: list[Script], tls: ssl.SSLContext | None = None) -> None:
        self.scripts = scripts
        self.tls = tls
        self.connections = 0
        self.heads: list[bytes] = []

    async def __aenter__(self) -> str:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0, ssl=self.tls)
        port = self.server.sockets[0].getsockname()[1]
        return f"{'https' if self.tls else 'http'}://localhost:{port}/api/v1/"

    async def __aexit__(self, *exc: object) -> None:
        self.server.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while self.scripts:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(
                    int(line.split(b":")[1])
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length")
                )
                await reader.readexactly(length)
                self.heads.append(head)
                await self.scripts.pop(0)(reader, writer)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


def chunked(*pieces: bytes) -> bytes:
    return b"".join(b"%x\r\n%s\r\n" % (len(piece), piece) for piece in pieces)


STREAM_HEAD = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n"
    b"x-generation-id: gen-t\r\n\r\n"
)


def byte_by_byte(data: bytes, then: bytes = b"") -> Script:
    """Writes `data` in pieces of 1 to 5 bytes with pauses, so reads split lines, chunk sizes and CRLFs."""

    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        position, step = 0, 1
        while position < len(data):
            writer.write(data[position : position + step])
            await writer.drain()
            await asyncio.sleep(0)
            position, step = position + step, step % 5 + 1
        writer.write(then)
        await writer.drain()

    return script


def whole(data: bytes, stay_open_s: float = 0.0) -> Script:
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(data)
        await writer.drain()
        await asyncio.sleep(stay_open_s)

    return script


def reset_after(data: bytes) -> Script:
    """Sends `data`, then resets the connection (RST, as a dropped proxy does)."""

    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(data)
        await writer.drain()
        await asyncio.sleep(0.05)
        sock = writer.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        writer.transport.abort()
        raise ConnectionResetError

    return script


async def streamed(url: str, started: list[str], read_timeout_s: float = 10.0) -> dict[str, Any]:
    transport = answer_transport(url, ssl.create_default_context(), 4)
    assert transport is not None
    async with httpx.AsyncClient(
        base_url=url,
        transport=transport,
        headers={"Authorization": f"Bearer {SECRET}"},
        timeout=httpx.Timeout(read_timeout_s),
    ) as http:

        async def on_started(generation_id: str) -> None:
            started.append(generation_id)

        return await read_streamed_reply(http, {"model": "m", "stream": True}, on_started)


def test_a_stream_split_anywhere_is_read_whole_and_its_connection_reused() -> None:
    text = "".join(f"w{i} " for i in range(400))  # past one batch of events
    events = [event(content_chunk(word)) for word in text.split(" ")[:-1]]
    events[-1] = event(content_chunk("w399", "stop"))
    body = b": OPENROUTER PROCESSING\n\n" + b"".join(events) + event(USAGE_CHUNK) + b"data: [DONE]\n\n"
    assert len(body) > BATCH_BYTES
    split = chunked(*[body[i : i + 97] for i in range(0, len(body), 97)]) + b"0\r\n\r\n"

    async def main() -> tuple[list[dict[str, Any]], RawServer]:
        server = RawServer(
            [byte_by_byte(STREAM_HEAD + split[:600], then=split[600:]), whole(STREAM_HEAD + split)]
        )
        async with server as url:
            transport = answer_transport(url, ssl.create_default_context(), 4)
            assert transport is not None
            async with httpx.AsyncClient(base_url=url, transport=transport) as http:
                replies = [await read_streamed_reply(http, {"stream": True}) for _ in range(2)]
        return replies, server

    replies, server = asyncio.run(main())
    for reply in replies:
        assert reply["response"]["content"] == "".join(f"w{i}" for i in range(400))
        assert reply["response"]["finish_reason"] == "stop"
        assert reply["usage"]["cost"] == 0.002 and reply["generation_id"] == "gen-t"
    assert server.connections == 1
    assert b"accept: text/event-stream" in server.heads[0].lower()


def test_the_first_chunks_id_is_journaled_before_the_answer_ends() -> None:
    head = STREAM_HEAD.replace(b"x-generation-id: gen-t\r\n", b"")
    first = chunked(event(content_chunk("a")))
    rest = chunked(event(content_chunk("b", "stop")), event(USAGE_CHUNK), b"data: [DONE]\n\n") + b"0\r\n\r\n"
    seen_at_first: list[list[str]] = []

    async def main() -> dict[str, Any]:
        started: list[str] = []

        async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            writer.write(head + first)
            await writer.drain()
            await asyncio.sleep(0.3)  # the client has read the first event by now
            seen_at_first.append(list(started))
            writer.write(rest)
            await writer.drain()

        async with RawServer([script]) as url:
            return await streamed(url, started)

    reply = asyncio.run(main())
    assert seen_at_first == [["gen-t"]]
    assert reply["response"]["content"] == "ab"


def test_an_error_chunk_fails_at_once_even_if_the_connection_stays_open() -> None:
    error = {"id": "gen-t", "error": {"code": 502, "message": "upstream died"}, "choices": []}
    body = STREAM_HEAD + chunked(event(content_chunk("part")), event(error))

    async def main() -> float:
        loop = asyncio.get_running_loop()
        async with RawServer([whole(body, stay_open_s=5.0)]) as url:
            began = loop.time()
            with pytest.raises(RequestFailed) as failed:
                await streamed(url, [])
            assert failed.value.status == 502 and failed.value.kind == "error_in_200"
            assert failed.value.generation_id == "gen-t"
            return loop.time() - began

    assert asyncio.run(main()) < 2.0


def test_a_bad_event_after_the_first_journals_its_id_and_names_the_answer() -> None:
    """The first chunk's id (no header here) is journaled even when a later event of the same read is not
    JSON, and the failure carries the id, so the ledger can still charge the request."""
    head = STREAM_HEAD.replace(b"x-generation-id: gen-t\r\n", b"")
    body = head + chunked(event(content_chunk("part")) + b"data: {not json\n\n") + b"0\r\n\r\n"

    async def main() -> tuple[list[str], RequestFailed]:
        started: list[str] = []
        async with RawServer([whole(body)]) as url:
            with pytest.raises(RequestFailed) as failed:
                await streamed(url, started)
        return started, failed.value

    started, failure = asyncio.run(main())
    assert started == ["gen-t"]
    assert failure.generation_id == "gen-t" and failure.provider == "Fake" and "not JSON" in failure.detail


def test_a_reset_mid_event_is_a_network_error_without_the_key() -> None:
    body = STREAM_HEAD + chunked(event(content_chunk("part")), b'data: {"id": "gen-t", "choi')

    async def main() -> None:
        async with RawServer([reset_after(body)]) as url:
            with pytest.raises(httpx.HTTPError) as failed:
                await streamed(url, [])
        assert isinstance(failed.value, httpx.ReadError | httpx.RemoteProtocolError)
        assert SECRET not in str(failed.value) and SECRET not in repr(failed.value.args)

    asyncio.run(main())


def test_a_body_cut_short_is_a_protocol_error() -> None:
    body = STREAM_HEAD + chunked(event(content_chunk("part")))

    async def main() -> None:
        async with RawServer([whole(body)]) as url:
            with pytest.raises(httpx.RemoteProtocolError):
                await streamed(url, [])

    asyncio.run(main())


def test_an_error_chunk_split_across_two_reads_still_wakes_the_reader() -> None:
    """`"error"` cut in two by a read boundary (the second half after a pause longer than a rest), on a
    connection the server keeps open: the answer fails at once, not at the read timeout."""
    error = {"id": "gen-t", "error": {"code": 502, "message": "upstream died"}, "choices": []}
    body = STREAM_HEAD + chunked(event(content_chunk("first")), event(content_chunk("second")), event(error))
    cut = body.index(b'"error"') + 3

    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(body[:cut])
        await writer.drain()
        await asyncio.sleep(0.8)
        writer.write(body[cut:])
        await writer.drain()
        await asyncio.sleep(8.0)

    async def main() -> float:
        loop = asyncio.get_running_loop()
        async with RawServer([script]) as url:
            began = loop.time()
            with pytest.raises(RequestFailed) as failed:
                await streamed(url, [], read_timeout_s=6.0)
            assert failed.value.status == 502
            return loop.time() - began

    assert asyncio.run(main()) < 3.0


@pytest.mark.parametrize(
    "head",
    [
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n+a\r\n",
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n0x5\r\n",
        b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 5\r\ncontent-length: 6\r\n\r\n"
        b"",
        b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: -1\r\n\r\n",
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
        + b"1" * 5000,
    ],
    ids=["signed-size", "0x-size", "two-lengths", "negative-length", "endless-size-line"],
)
def test_framing_that_http_1_1_does_not_allow_is_a_protocol_error(head: bytes) -> None:
    async def main() -> None:
        async with RawServer([whole(head, stay_open_s=3.0)]) as url:
            with pytest.raises(httpx.RemoteProtocolError):
                await streamed(url, [], read_timeout_s=2.0)

    asyncio.run(main())


def test_an_interim_100_is_skipped_and_a_double_framed_answer_is_not_reused() -> None:
    """`100 Continue` before the answer is skipped; an answer framed both chunked and by a length is read
    chunked (as RFC 9112 says) and its connection not used again."""
    body = chunked(event(content_chunk("ok", "stop")), event(USAGE_CHUNK), b"data: [DONE]\n\n") + b"0\r\n\r\n"
    both = STREAM_HEAD.replace(b"\r\n\r\n", b"\r\ncontent-length: 3\r\n\r\n")
    interim = b"HTTP/1.1 100 Continue\r\n\r\n"

    async def main() -> tuple[list[dict[str, Any]], RawServer]:
        server = RawServer([whole(interim + both + body), whole(STREAM_HEAD + body)])
        async with server as url:
            replies = [await streamed(url, []) for _ in range(2)]
        return replies, server

    replies, server = asyncio.run(main())
    assert [reply["response"]["content"] for reply in replies] == ["ok", "ok"]
    assert server.connections == 2


def test_a_stalled_stream_times_out_on_the_gap_between_reads() -> None:
    body = STREAM_HEAD + chunked(event(content_chunk("part")))

    async def main() -> float:
        loop = asyncio.get_running_loop()
        async with RawServer([whole(body, stay_open_s=5.0)]) as url:
            began = loop.time()
            with pytest.raises(httpx.ReadTimeout):
                await streamed(url, [], read_timeout_s=0.5)
            return loop.time() - began

    assert 0.5 <= asyncio.run(main()) < 2.0


def test_keep_alive_comments_reset_the_read_timeout() -> None:
    events = [
        event(content_chunk("a")),
        event(content_chunk("b", "stop")),
        event(USAGE_CHUNK),
        b"data: [DONE]\n\n",
    ]

    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(STREAM_HEAD + chunked(events[0]))
        for _ in range(6):  # 1.2 s in all, longer than the read timeout, never 0.4 s silent
            await asyncio.sleep(0.2)
            writer.write(chunked(b": OPENROUTER PROCESSING\n\n"))
        writer.write(chunked(*events[1:]) + b"0\r\n\r\n")
        await writer.drain()

    async def main() -> dict[str, Any]:
        async with RawServer([script]) as url:
            return await streamed(url, [], read_timeout_s=0.4)

    assert asyncio.run(main())["response"]["content"] == "ab"


def test_an_http_error_with_a_length_is_read_with_its_retry_after() -> None:
    error = json.dumps({"error": {"code": 429, "message": "slow down"}}).encode()
    head = b"HTTP/1.1 429 Too Many Requests\r\ncontent-type: application/json\r\nretry-after: 3\r\n"
    response = head + b"content-length: %d\r\n\r\n%s" % (len(error), error)

    async def main() -> None:
        async with RawServer([whole(response)]) as url:
            with pytest.raises(RequestFailed) as failed:
                await streamed(url, [])
        assert failed.value.status == 429 and failed.value.wait and failed.value.wait.seconds == 3.0
        assert "slow down" in failed.value.detail

    asyncio.run(main())


def test_a_proxy_from_the_environment_leaves_streams_to_httpx(monkeypatch: pytest.MonkeyPatch) -> None:
    tls = ssl.create_default_context()
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.internal:3128")
    monkeypatch.setenv("NO_PROXY", "localhost")
    assert answer_transport("https://openrouter.ai/api/v1", tls, 4) is None
    assert answer_transport("https://localhost:8000/api/v1", tls, 4) is not None
    monkeypatch.delenv("HTTPS_PROXY")
    assert answer_transport("https://openrouter.ai/api/v1", tls, 4) is not None


PLAIN_ANSWER = json.dumps(
    {
        "id": "gen-r",
        "provider": "Fake",
        "choices": [{"index": 0, "message": {"content": "hi"}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 1, "cost": 0.001},
    }
).encode()
PLAIN_RESPONSE = (
    b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nx-generation-id: gen-r\r\n"
    b"content-length: %d\r\n\r\n%s" % (len(PLAIN_ANSWER), PLAIN_ANSWER)
)


def test_a_chat_route_sends_what_httpx_s_client_would() -> None:
    """Past httpx's client layer, the same request goes out: the client's headers (the key's included),
    the route's extra ones, the same JSON body; without the transport (a proxy) the client sends it."""

    async def main() -> tuple[list[dict[str, Any]], RawServer, RawServer]:
        server, through_client = RawServer([whole(PLAIN_RESPONSE)] * 4), RawServer([whole(PLAIN_RESPONSE)])
        replies = []
        async with server as url:
            transport = answer_transport(url, ssl.create_default_context(), 4)
            assert transport is not None
            headers = {"Authorization": f"Bearer {SECRET}"}
            async with httpx.AsyncClient(base_url=url, transport=transport, headers=headers) as http:
                route = ChatRoute(http, transport)
                replies.append(await read_reply(http, {"model": "m"}))
                replies.append(await read_reply(route, {"model": "m"}))
                with pytest.raises(RequestFailed):  # the plain JSON is not an event stream
                    await read_streamed_reply(http, {"stream": True})
                with pytest.raises(RequestFailed):
                    await read_streamed_reply(route, {"stream": True})
        async with through_client as url, httpx.AsyncClient(base_url=url, headers=headers) as http:
            replies.append(await read_reply(ChatRoute(http, None), {"model": "m"}))
        return replies, server, through_client

    replies, server, through_client = asyncio.run(main())
    assert [reply["generation_id"] for reply in replies] == ["gen-r"] * 3
    client_plain, route_plain, client_stream, route_stream = server.heads
    assert route_plain == client_plain and route_stream == client_stream
    assert b"accept: text/event-stream" in route_stream.lower() and SECRET.encode() in route_plain
    (proxied,) = through_client.heads
    assert header_lines(proxied) == header_lines(client_plain)


def header_lines(head: bytes) -> list[bytes]:
    """The request line and headers, in lower case, in order, without Host (the servers' ports differ)."""
    return [line.lower() for line in head.split(b"\r\n") if not line.lower().startswith(b"host:")]


def test_a_plain_answer_is_read_whole_in_pieces_and_its_connection_reused() -> None:
    """Byte by byte, the head comes before the body: its id is journaled early (`on_started`). Sent whole,
    the body came with the head and nothing is left to cut off: no `started` line, the record follows."""
    answer = {
        "id": "gen-p",
        "provider": "Fake",
        "choices": [{"index": 0, "message": {"content": "data: not an event"}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 4, "cost": 0.003},
    }
    body = json.dumps(answer).encode()
    head = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nx-generation-id: gen-p\r\n"
    response = head + b"content-length: %d\r\n\r\n%s" % (len(body), body)

    async def main() -> tuple[list[dict[str, Any]], list[str], RawServer]:
        started: list[str] = []

        async def on_started(generation_id: str) -> None:
            started.append(generation_id)

        server = RawServer([byte_by_byte(response), whole(response)])
        async with server as url:
            transport = answer_transport(url, ssl.create_default_context(), 4)
            assert transport is not None
            async with httpx.AsyncClient(base_url=url, transport=transport) as http:
                replies = [await read_reply(http, {"model": "m"}, on_started) for _ in range(2)]
        return replies, started, server

    replies, started, server = asyncio.run(main())
    assert [reply["response"]["content"] for reply in replies] == ["data: not an event"] * 2
    assert started == ["gen-p"] and server.connections == 1


def self_signed(folder: Path) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    """A server context with a fresh self-signed certificate for localhost, and a client that trusts it."""
    x509 = pytest.importorskip("cryptography.x509")
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(x509.oid.NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost")]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = folder / "cert.pem", folder / "key.pem"
    cert_path.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server.load_cert_chain(cert_path, key_path)
    return server, ssl.create_default_context(cafile=str(cert_path))


def test_a_stream_over_tls_is_read_whole_in_rests_and_its_connection_reused(tmp_path: Path) -> None:
    server_tls, client_tls = self_signed(tmp_path)
    events = [event(content_chunk(f"t{i}")) for i in range(29)] + [event(content_chunk("t29", "stop"))]

    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(STREAM_HEAD)
        for piece in [*events, event(USAGE_CHUNK), b"data: [DONE]\n\n"]:
            writer.write(chunked(piece))
            await writer.drain()
            await asyncio.sleep(0.02)  # 0.6 s in all: more than one rest
        writer.write(b"0\r\n\r\n")
        await writer.drain()

    async def main() -> tuple[list[dict[str, Any]], RawServer]:
        server = RawServer([script, script], tls=server_tls)
        async with server as url:
            transport = answer_transport(url, client_tls, 4)
            assert transport is not None
            async with httpx.AsyncClient(base_url=url, transport=transport) as http:
                replies = [await read_streamed_reply(http, {"stream": True}) for _ in range(2)]
        return replies, server

    replies, server = asyncio.run(main())
    for reply in replies:
        assert reply["response"]["content"] == "".join(f"t{i}" for i in range(30))
        assert reply["usage"]["cost"] == 0.002
    assert server.connections == 1


def http_200(body: bytes, content_type: str) -> bytes:
    head = b"HTTP/1.1 200 OK\r\ncontent-type: %s\r\ncontent-length: %d\r\n\r\n"
    return head % (content_type.encode(), len(body)) + body


def test_prompt_ids_are_kept_where_vllm_and_sglang_put_them() -> None:
    """vLLM: `prompt_token_ids` at the top level (first chunk when streamed); SGLang: in `choices[0]`."""
    message = {"index": 0, "message": {"content": "hi"}, "finish_reason": "stop", "token_ids": [7]}
    vllm = {"id": "gen-v", "choices": [message], "prompt_token_ids": [1, 2, 3]}
    sglang = {"id": "gen-s", "choices": [{**message, "prompt_token_ids": [4, 5]}]}
    stream = b"".join(
        [
            event(content_chunk("h", prompt_token_ids=[6, 7])),
            event(content_chunk("i", finish="stop")),
            event(USAGE_CHUNK),
            b"data: [DONE]\n\n",
        ]
    )

    async def main() -> list[dict[str, Any]]:
        scripts = [
            whole(http_200(json.dumps(vllm).encode(), "application/json")),
            whole(http_200(json.dumps(sglang).encode(), "application/json")),
            whole(http_200(stream, "text/event-stream")),
        ]
        async with RawServer(scripts) as url, httpx.AsyncClient(base_url=url) as http:
            return [
                await read_reply(http, {"model": "m"}),
                await read_reply(http, {"model": "m"}),
                await read_streamed_reply(http, {"stream": True}),
            ]

    replies = asyncio.run(main())
    assert [reply["response"]["prompt_token_ids"] for reply in replies] == [[1, 2, 3], [4, 5], [6, 7]]
