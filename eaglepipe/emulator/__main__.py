"""`python -m eaglepipe.emulator --model-dir DIR`: OpenRouter's API on loopback, answered by the local model.

The tests' modes (synthetic answers, the Kimi corpus, injected faults: `python -m support.emulator` under
tests/) reuse this command line and `serve`. The port file is written (atomically) only once the server is
listening, so whoever waits for it can send requests at once; it is removed again on a clean shutdown.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import resource
import signal
import socket
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import uvicorn
from starlette.applications import Starlette
from starlette.routing import Route

from eaglepipe.emulator.app import Emulator
from eaglepipe.emulator.backend import PromptText, ReplyShape, TextReplies, TokenEngine
from eaglepipe.emulator.errors import EmulatorError
from eaglepipe.emulator.faults import FaultSource
from eaglepipe.emulator.providers import Endpoint, ReplyHabits, load_endpoints
from eaglepipe.emulator.routes import build_app
from eaglepipe.emulator.text_like import SERVED_SWITCHES, SWITCHES
from eaglepipe.io import atomic_write
from eaglepipe.target.architecture import TargetArchitecture, TargetConfigError
from eaglepipe.target.tokenizer import has_kimi_tokenizer

log = logging.getLogger("eaglepipe.emulator")
KIMI_HINT = "--model-dir with Kimi's tokenizer files"


def build_parser(prog: str, description: str) -> tuple[argparse.ArgumentParser, argparse._ActionsContainer]:
    """The server's command line, and its group of answer sources (`--model-dir`; a mode adds its own)."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--model-dir", type=Path, help="Hugging Face model directory to serve")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 binds a free port (see --port-file)")
    parser.add_argument("--port-file", type=Path, help="write the bound port here once listening")
    parser.add_argument(
        "--config", type=Path, help="YAML/JSON file with an 'endpoints' list replacing the default"
    )
    parser.add_argument(
        "--credit-limit", type=float, metavar="USD", help="answer 402 once this much is charged"
    )
    parser.add_argument(
        "--key-limit",
        type=float,
        metavar="USD",
        help="the key's own limit: answer 403 openrouter_key_limit once this much is charged",
    )
    parser.add_argument(
        "--in-flight-budget",
        type=float,
        metavar="USD",
        help="answer 402 openrouter_in_flight_budget (Retry-After 1) while the worst-case cost of the "
        "requests in flight (prompt + max_tokens at the endpoint's price) would pass this",
    )
    parser.add_argument("--model-id", default="local/smollm2-135m-instruct", help="the id clients ask for")
    parser.add_argument(
        "--require-key-file",
        type=Path,
        metavar="PATH",
        help="answer 401 unless the bearer token equals this file's content",
    )
    parser.add_argument("--tokens-per-event", type=int, default=1, help="tokens per streamed data chunk")
    parser.add_argument(
        "--generation-delay-s",
        type=float,
        default=0.0,
        help="/generation answers 404 for this long after a generation ends, as OpenRouter does",
    )
    parser.add_argument(
        "--store-content",
        action="store_true",
        help="the account stores prompts and answers: /generation/content serves them (else 404)",
    )
    model = parser.add_argument_group("model mode")
    model.add_argument("--max-batch", type=int, default=16, help="most requests generated together")
    model.add_argument(
        "--text-like",
        choices=SERVED_SWITCHES,
        help="return text as this engine would (eaglepipe/emulator/text_like.py); default exact",
    )
    model.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads for the model; 1 is fastest on a shared machine (batching gives the throughput)",
    )
    return parser, source


def check_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """The checks of the server's own options (argparse's exit 2 and one line)."""
    if args.model_id.count("/") != 1:
        parser.error("--model-id must look like author/slug")
    if args.max_batch < 1 or args.threads < 1 or args.tokens_per_event < 1:
        parser.error("--max-batch, --threads and --tokens-per-event must be at least 1")
    if args.generation_delay_s < 0:
        parser.error("--generation-delay-s must not be negative")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser, _ = build_parser("python -m eaglepipe.emulator", __doc__.splitlines()[0])
    args = parser.parse_args(argv)
    check_args(parser, args)
    return args


def _read_key(path: Path | None) -> str | None:
    if path is None:
        return None
    try:
        key = path.read_text().strip()
    except OSError as exc:
        raise EmulatorError(f"{path}: cannot read the required API key ({exc.strerror})") from None
    if not key:
        raise EmulatorError(f"{path}: the key file is empty; write the expected bearer token into it")
    return key


def _bind(host: str, port: int) -> socket.socket:
    # IPPROTO_TCP spelled out: asyncio turns Nagle's algorithm off only on sockets that say so, and
    # with it on, each answer written in two parts waits ~40 ms for the client's delayed ACK.
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise EmulatorError(
            f"cannot listen on {host}:{port} ({exc.strerror}); choose another --port or 0"
        ) from None
    return sock


def _allow_many_connections() -> None:
    """Thousands of clients in flight need as many sockets: raise the open-file limit to the hard one."""
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


async def _serve(app: Starlette, sock: socket.socket, host: str, port_file: Path | None) -> None:
    # Idle connections stay open 75 s (nginx's default) rather than uvicorn's 5 s: a client pool of
    # thousands otherwise reuses connections just as the server closes them, and sees read errors.
    config = uvicorn.Config(
        app,
        log_level="warning",
        access_log=False,
        lifespan="on",
        timeout_graceful_shutdown=3,
        timeout_keep_alive=75,
    )
    server = uvicorn.Server(config)
    serving = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started and not serving.done():
        await asyncio.sleep(0.02)
    if server.started:
        port = sock.getsockname()[1]
        if port_file is not None:
            atomic_write(port_file, lambda tmp: tmp.write_text(f"{port}\n"))
        print(f"emulator listening on http://{host}:{port}/api/v1", flush=True)
    try:
        await serving
    finally:
        if port_file is not None and server.started:
            port_file.unlink(missing_ok=True)
        log.info("stopped")


def _context_length(model_dir: Path) -> int:
    try:
        return TargetArchitecture.from_dir(model_dir).max_position_embeddings
    except TargetConfigError as err:
        raise EmulatorError(f"{err}; pass --model-dir a Hugging Face model directory") from None


def _model_backend(args: argparse.Namespace) -> tuple[TokenEngine, PromptText, ReplyShape]:
    """The real model: imported here, so that a mode without one never loads torch or transformers. A model in
    Kimi-K2.5's layout answers with reasoning and tool calls as each endpoint's habits say (kimi_model.py);
    any other answers plain text, as `--text-like` says."""
    import torch

    from eaglepipe.emulator.engine import Engine
    from eaglepipe.target.load import load_target, load_target_tokenizer, load_tokenizer

    torch.set_num_threads(args.threads)
    model = load_target(args.model_dir)
    pad_id = TargetArchitecture.from_dir(args.model_dir).pad_token_id
    if has_kimi_tokenizer(args.model_dir):
        from eaglepipe.emulator.kimi_model import KimiModelReplies, KimiModelText

        text = KimiModelText(load_target_tokenizer(args.model_dir))
        engine = Engine(model, text.tokenizer.stop_id, pad_id, max_batch=args.max_batch)
        return engine, text, KimiModelReplies(text)
    from eaglepipe.emulator.text import TokenizerText

    tokenizer = load_tokenizer(args.model_dir)
    plain = TokenizerText(tokenizer, SWITCHES[args.text_like or "exact"])
    stop_id = plain.target.stop_id
    engine = Engine(model, stop_id, tokenizer.pad_token_id, max_batch=args.max_batch)
    return engine, plain, TextReplies(plain)


@dataclass
class Setup:
    """What a mode serves, decided before the port is bound (so that a bad command line or file fails
    before a model loads): `backend` builds the engine, text side and reply shape (None: plain text) once
    it is."""

    context_length: int
    endpoints: list[Endpoint]
    backend: Callable[[], tuple[TokenEngine, PromptText, ReplyShape | None]]
    source: str
    faults: FaultSource | None = None
    routes: Callable[[Emulator], Sequence[Route]] = lambda emulator: ()


def model_setup(args: argparse.Namespace, habits_hint: str = KIMI_HINT) -> Setup:
    """The local model: a Kimi-layout one applies the endpoints' habits, any other refuses them."""
    context_length = _context_length(args.model_dir)
    endpoints = load_endpoints(args.config, args.model_id, context_length)
    kimi_model = has_kimi_tokenizer(args.model_dir)
    if kimi_model and args.text_like is not None:
        endpoints = [e.with_text_like(args.text_like) for e in endpoints]
    if not kimi_model:
        refuse_habits(args, endpoints, habits_hint)
    source = f"{args.model_dir} (max batch {args.max_batch}, text like {args.text_like or 'exact'})"
    return Setup(context_length, endpoints, lambda: _model_backend(args), source)


def refuse_habits(args: argparse.Namespace, endpoints: Sequence[Endpoint], hint: str) -> None:
    if habits := [e.tag for e in endpoints if e.habits != ReplyHabits()]:
        raise EmulatorError(
            f"{args.config}: endpoint {habits[0]} sets `habits`, which only a Kimi-layout target applies "
            f"({hint})"
        )


def serve(args: argparse.Namespace, setup: Callable[[argparse.Namespace], Setup]) -> int:
    """Serve what `setup` decides until SIGTERM or SIGINT; 2 and one line for what is wrong at the start."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    # uvicorn handles SIGTERM/SIGINT while serving and re-raises them after its clean shutdown; exit quietly.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:  # everything that can be wrong with the command line fails here, before a model loads
        api_key = _read_key(args.require_key_file)
        served = setup(args)
        sock = _bind(args.host, args.port)
    except EmulatorError as exc:
        print(f"emulator: {exc}", file=sys.stderr)
        return 2
    _allow_many_connections()
    engine, text, replies = served.backend()
    emulator = Emulator(
        engine,
        text,
        served.endpoints,
        model_id=args.model_id,
        context_length=served.context_length,
        credit_limit=args.credit_limit,
        key_limit=args.key_limit,
        in_flight_budget=args.in_flight_budget,
        api_key=api_key,
        faults=served.faults,
        tokens_per_event=args.tokens_per_event,
        generation_delay_s=args.generation_delay_s,
        replies=replies,
        store_content=args.store_content,
    )
    log.info(
        "serving %s from %s: %d endpoints%s",
        args.model_id,
        served.source,
        len(served.endpoints),
        ", key required" if api_key else "",
    )
    try:
        asyncio.run(_serve(build_app(emulator, served.routes(emulator)), sock, args.host, args.port_file))
    except KeyboardInterrupt:
        return 130
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return serve(parse_args(argv), model_setup)


if __name__ == "__main__":
    sys.exit(main())
