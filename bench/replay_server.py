"""A benchmark server that replays the emulator's answers at the seeds' full shape: 2000 in flight, one
token per SSE event, 30k events/s, on a core or less.

Why: the emulator makes each token as it goes (its engine, starlette, uvicorn): about 0.1 ms of CPU per
event, so two cores serve about 4k events/s and `generation_client.py --seeds` has to scale the shape
down (150 in flight), which weighs the client's per-second work 13 times too heavily per event and hides
what grows with the requests in flight. This server does no generating: at start it records one
streamed and one plain answer from the synthetic emulator (`max_tokens` long, one token per event), and
replays their bytes for every request, cut to the request's own length (log-normal around
`--mean-tokens`), with the request's own generation id, finish reason and usage. Events leave one per
write, each when its time comes (first token after `--latency-s`, then `--tokens-per-s`), from one timer
wheel for all streams. A plain answer's head and body are written apart, as uvicorn does. Only `POST
.../chat/completions` and `GET /emulator/stats` (the counters the benchmark samples, as the emulator's
are named) are served.

Unlike the emulator, it counts a stream's tokens as they are sent (`completion_tokens`), so a benchmark
window can tell which events fell inside it (`counts_tokens_as_sent`).

    python bench/replay_server.py --port-file /tmp/port --tokens-per-s 15 --mean-tokens 1700
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import httpx

from eaglepipe.io import atomic_write

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))  # the tests' `support` package
from support.emulator import running_emulator  # noqa: E402

TICK_S = 0.01  # the timer wheel's step: events leave at most this late
MODEL = "moonshotai/kimi-k2.5"
ID_WIDTH = 24  # the emulator's ids: "gen-" and 24 URL-safe characters


def record(model: str, max_tokens: int) -> tuple[list[bytes], dict[str, Any]]:
    """(a streamed answer's SSE events as sent, the plain answer's JSON) of `max_tokens` tokens each."""
    emulator = ["--model-id", model, "--seed", "1", "--tokens-per-s", "0", "--latency-s", "0"]
    emulator += ["--mean-tokens", str(max_tokens * 100), "--length-sigma", "0", "--tokens-per-event", "1"]
    body = {"model": model, "messages": [{"role": "user", "content": "Hello"}], "max_tokens": max_tokens}
    with running_emulator(None, extra_args=emulator) as url, httpx.Client(base_url=url, timeout=120) as http:
        with http.stream("POST", "/chat/completions", json={**body, "stream": True}) as response:
            text = response.read().decode()
        plain = http.post("/chat/completions", json=body).json()
    events = [event + "\n\n" for event in text.split("\n\n") if event]
    return [event.encode() for event in events], plain


class Answers:
    """The recorded answers, re-rendered per request."""

    def __init__(self, events: list[bytes], plain: dict[str, Any]) -> None:
        self.opening = [event for event in events if event.startswith(b":")]
        chunks = [(event, json.loads(event[6:])) for event in events if event.startswith(b"data: {")]
        content = [(event, chunk) for event, chunk in chunks if _delta(chunk).get("content")]
        self.template_id = chunks[0][1]["id"].encode()
        assert len(self.template_id) == len(b"gen-") + ID_WIDTH, self.template_id
        self.tokens = [_chunked(event) for event, _ in content]  # the bytes as the emulator sent them
        self.pieces = [_delta(chunk)["content"] for _, chunk in content]
        self.finish_chunk = next(
            chunk for _, chunk in chunks if chunk["choices"] and chunk["choices"][0].get("finish_reason")
        )
        self.usage_chunk = next(chunk for _, chunk in chunks if chunk.get("usage"))
        self.plain = plain
        self.price = plain["usage"]["cost"] / plain["usage"]["completion_tokens"]

    def usage(self, tokens: int) -> dict[str, Any]:
        prompt = self.plain["usage"]["prompt_tokens"]
        return {
            **self.plain["usage"],
            "completion_tokens": tokens,
            "total_tokens": prompt + tokens,
            "cost": tokens * self.price,
        }

    def stream_head(self, generation_id: bytes) -> bytes:
        head = (
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream; charset=utf-8\r\n"
            b"cache-control: no-cache\r\ntransfer-encoding: chunked\r\nx-generation-id: %s\r\n\r\n"
        ) % generation_id
        return head + b"".join(_chunked(event) for event in self.opening)

    def stream_events(self, generation_id: bytes, start: int, stop: int) -> bytes:
        """Token events `start` to `stop` of an answer, with its generation id."""
        return b"".join(self.tokens[start:stop]).replace(self.template_id, generation_id)

    def stream_end(self, generation_id: bytes, tokens: int) -> bytes:
        identity = {"id": generation_id.decode()}
        finish = {**self.finish_chunk, **identity}
        finish["choices"] = [
            {**finish["choices"][0], "finish_reason": "stop", "native_finish_reason": "stop"}
        ]
        usage = {**self.usage_chunk, **identity, "usage": self.usage(tokens)}
        events = [
            b"data: " + json.dumps(chunk, separators=(",", ":")).encode() + b"\n\n"
            for chunk in (finish, usage)
        ]
        return b"".join(_chunked(event) for event in [*events, b"data: [DONE]\n\n"]) + b"0\r\n\r\n"

    def plain_answer(self, generation_id: bytes, tokens: int) -> tuple[bytes, bytes]:
        choice = self.plain["choices"][0]
        message = {**choice["message"], "content": "".join(self.pieces[:tokens])}
        answer = {
            **self.plain,
            "id": generation_id.decode(),
            "choices": [
                {**choice, "message": message, "finish_reason": "stop", "native_finish_reason": "stop"}
            ],
            "usage": self.usage(tokens),
        }
        body = json.dumps(answer, separators=(",", ":")).encode()
        head = (
            b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n"
            b"x-generation-id: %s\r\n\r\n"
        ) % (len(body), generation_id)
        return head, body


def _delta(chunk: dict[str, Any]) -> dict[str, Any]:
    return chunk["choices"][0].get("delta") or {} if chunk.get("choices") else {}


def _chunked(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


class Replay:
    """The server's state: counters, the timer wheel of streams waiting for their next event."""

    def __init__(self, answers: Answers, args: argparse.Namespace) -> None:
        self.answers = answers
        self.latency_s = args.latency_s
        self.tokens_per_s = args.tokens_per_s
        self.mean_tokens = args.mean_tokens
        self.length_sigma = args.length_sigma
        self.max_tokens = len(answers.tokens)
        self.random = random.Random(args.seed)
        self.loop = asyncio.get_running_loop()
        self.wheel: dict[int, list[Stream]] = defaultdict(list)
        self.next_slot = self._slot(self.loop.time())
        self.issued = 0
        self.stats = {
            "pid": os.getpid(),
            "requests_received": 0,
            "responses_completed": 0,
            "requests_billed": 0,
            "completion_tokens": 0,
            "in_flight": 0,
            "counts_tokens_as_sent": True,
        }
        self.loop.call_later(TICK_S, self._tick)

    def length(self) -> int:
        drawn = self.mean_tokens * math.exp(
            self.length_sigma * self.random.gauss(0, 1) - self.length_sigma**2 / 2
        )
        return max(1, min(self.max_tokens, round(drawn)))

    def generation_id(self) -> bytes:
        self.issued += 1
        return b"gen-%0*d" % (ID_WIDTH, self.issued)

    def schedule(self, stream: Stream, at: float) -> None:
        self.wheel[max(self._slot(at), self.next_slot)].append(stream)

    def _slot(self, at: float) -> int:
        return math.ceil(at / TICK_S)

    def _tick(self) -> None:
        now = self.loop.time()
        while self.next_slot * TICK_S <= now:  # a slot's streams are due at its time, not before
            slot, self.next_slot = self.next_slot, self.next_slot + 1
            for stream in self.wheel.pop(slot, ()):
                stream.send_due(now)
        self.loop.call_later(TICK_S, self._tick)


class Stream:
    """One streamed answer on its connection: `sent` of its `tokens` events are out."""

    def __init__(self, replay: Replay, connection: Connection, generation_id: bytes, tokens: int) -> None:
        self.replay, self.connection = replay, connection
        self.generation_id, self.tokens = generation_id, tokens
        self.sent = 0
        self.first_at = replay.loop.time() + replay.latency_s
        replay.schedule(self, self.first_at)

    def send_due(self, now: float) -> None:
        if self.connection.closed:
            return
        replay = self.replay
        due = min(self.tokens, int((now - self.first_at) * replay.tokens_per_s) + 1)
        if due > self.sent:
            self.connection.write(replay.answers.stream_events(self.generation_id, self.sent, due))
            replay.stats["completion_tokens"] += due - self.sent
            self.sent = due
        if self.sent < self.tokens:
            replay.schedule(self, self.first_at + self.sent / replay.tokens_per_s)
            return
        self.connection.write(replay.answers.stream_end(self.generation_id, self.tokens))
        replay.stats["responses_completed"] += 1
        replay.stats["requests_billed"] += 1
        replay.stats["in_flight"] -= 1
        self.connection.busy = False


class Connection(asyncio.Protocol):
    """HTTP/1.1, requests with a Content-Length body, kept alive; one request at a time."""

    def __init__(self, replay: Replay) -> None:
        self.replay = replay
        self.buffer = b""
        self.closed = False
        self.busy = False
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        if self.busy:
            self.replay.stats["in_flight"] -= 1
        self.closed = True

    def write(self, data: bytes) -> None:
        if not self.closed and self.transport is not None:
            self.transport.write(data)

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        end = self.buffer.find(b"\r\n\r\n")
        if end == -1:
            return
        head = self.buffer[:end].decode("latin-1").split("\r\n")
        fields = {
            name.strip().lower(): value.strip()
            for name, _, value in (line.partition(":") for line in head[1:])
        }
        length = int(fields.get("content-length", "0"))
        if len(self.buffer) < end + 4 + length:
            return
        body, self.buffer = self.buffer[end + 4 : end + 4 + length], self.buffer[end + 4 + length :]
        method, path, _ = head[0].split(" ", 2)
        if method == "POST" and path.endswith("/chat/completions"):
            self.answer(json.loads(body))
        elif method == "GET" and path.endswith("/emulator/stats"):
            self.send_json(self.replay.stats)
        else:
            self.send_json(
                {"error": {"code": 404, "message": f"{method} {path} is not replayed"}}, b"404 Not Found"
            )

    def send_json(self, data: dict[str, Any], status: bytes = b"200 OK") -> None:
        body = json.dumps(data).encode()
        self.write(
            b"HTTP/1.1 %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
            % (status, len(body), body)
        )

    def answer(self, request: dict[str, Any]) -> None:
        replay = self.replay
        replay.stats["requests_received"] += 1
        replay.stats["in_flight"] += 1
        self.busy = True
        generation_id, tokens = (
            replay.generation_id(),
            min(replay.length(), int(request.get("max_tokens") or 10**9)),
        )
        if request.get("stream"):
            self.write(replay.answers.stream_head(generation_id))
            Stream(replay, self, generation_id, tokens)
            return
        head, body = replay.answers.plain_answer(generation_id, tokens)
        replay.loop.call_later(
            replay.latency_s + tokens / replay.tokens_per_s, self.send_plain, head, body, tokens
        )

    def send_plain(self, head: bytes, body: bytes, tokens: int) -> None:
        if self.closed:
            return
        self.write(head)
        self.write(body)
        stats = self.replay.stats
        stats["responses_completed"] += 1
        stats["requests_billed"] += 1
        stats["completion_tokens"] += tokens
        stats["in_flight"] -= 1
        self.busy = False


async def serve(args: argparse.Namespace) -> None:
    events, plain = record(args.model_id, args.record_tokens)
    replay = Replay(Answers(events, plain), args)
    server = await asyncio.get_running_loop().create_server(
        lambda: Connection(replay), "127.0.0.1", 0, backlog=4096
    )
    port = server.sockets[0].getsockname()[1]
    atomic_write(args.port_file, lambda tmp: tmp.write_text(f"{port}\n"))  # read once it exists
    print(f"replaying on http://127.0.0.1:{port}/api/v1", file=sys.stderr, flush=True)
    async with server:
        await server.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port-file", type=Path, required=True)
    parser.add_argument("--model-id", default=MODEL)
    parser.add_argument("--tokens-per-s", type=float, default=15.0)
    parser.add_argument("--latency-s", type=float, default=0.5)
    parser.add_argument("--mean-tokens", type=int, default=1700)
    parser.add_argument("--length-sigma", type=float, default=0.3)
    parser.add_argument("--record-tokens", type=int, default=4000, help="the longest answer replayed")
    parser.add_argument("--seed", type=int, default=1)
    asyncio.run(serve(parser.parse_args()))


if __name__ == "__main__":
    main()
