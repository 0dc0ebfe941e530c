"""`python -m eaglepipe.emulator --model-dir DIR`: serve the local model with OpenRouter's API.

The port file is written (atomically) only once the model is loaded and the socket is listening, so
whoever waits for it can send requests at once; it is removed again on a clean shutdown.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import signal
import socket
import sys
from collections.abc import Sequence
from pathlib import Path

import torch
import uvicorn

from eaglepipe.emulator.app import Emulator, build_app
from eaglepipe.emulator.engine import Engine
from eaglepipe.emulator.errors import EmulatorError
from eaglepipe.emulator.providers import load_endpoints
from eaglepipe.io import atomic_write
from eaglepipe.target.load import load_target

log = logging.getLogger("eaglepipe.emulator")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m eaglepipe.emulator", description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", type=Path, required=True, help="Hugging Face model directory to serve")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 binds a free port (see --port-file)")
    parser.add_argument("--port-file", type=Path, help="write the bound port here once listening")
    parser.add_argument(
        "--config", type=Path, help="YAML/JSON file with an 'endpoints' list replacing the default"
    )
    parser.add_argument(
        "--credit-limit", type=float, metavar="USD", help="answer 402 once this much is charged"
    )
    parser.add_argument("--model-id", default="local/smollm2-135m-instruct", help="the id clients ask for")
    parser.add_argument("--max-batch", type=int, default=16, help="most requests generated together")
    parser.add_argument(
        "--require-key-file",
        type=Path,
        metavar="PATH",
        help="answer 401 unless the bearer token equals this file's content",
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads for the model; 1 is fastest on a shared machine (batching gives the throughput)",
    )
    args = parser.parse_args(argv)
    if args.model_id.count("/") != 1:
        parser.error("--model-id must look like author/slug")
    if args.max_batch < 1 or args.threads < 1:
        parser.error("--max-batch and --threads must be at least 1")
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
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise EmulatorError(
            f"cannot listen on {host}:{port} ({exc.strerror}); choose another --port or 0"
        ) from None
    return sock


async def _serve(app: object, sock: socket.socket, host: str, port_file: Path | None) -> None:
    server = uvicorn.Server(
        uvicorn.Config(app, log_level="warning", access_log=False, lifespan="on", timeout_graceful_shutdown=3)
    )
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
        config = json.loads((model_dir / "config.json").read_text())
        return int(config["max_position_embeddings"])
    except (OSError, ValueError, KeyError, TypeError):
        raise EmulatorError(
            f"{model_dir}: no readable config.json with max_position_embeddings; "
            "pass --model-dir a Hugging Face model directory"
        ) from None


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    # uvicorn handles SIGTERM/SIGINT while serving and re-raises them after its clean shutdown; exit quietly.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:  # everything that can be wrong with the command line fails here, before the model loads
        api_key = _read_key(args.require_key_file)
        context_length = _context_length(args.model_dir)
        endpoints = load_endpoints(args.config, args.model_id, context_length)
        sock = _bind(args.host, args.port)
    except EmulatorError as exc:
        print(f"emulator: {exc}", file=sys.stderr)
        return 2
    torch.set_num_threads(args.threads)
    model, tokenizer = load_target(args.model_dir)
    engine = Engine(model, tokenizer, max_batch=args.max_batch)
    emulator = Emulator(
        engine,
        tokenizer,
        endpoints,
        model_id=args.model_id,
        context_length=context_length,
        credit_limit=args.credit_limit,
        api_key=api_key,
    )
    log.info(
        "serving %s from %s: %d endpoints, max batch %d%s",
        args.model_id,
        args.model_dir,
        len(endpoints),
        args.max_batch,
        ", key required" if api_key else "",
    )
    try:
        asyncio.run(_serve(build_app(emulator), sock, args.host, args.port_file))
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
