"""The engine source's failures end in one line naming the URL or log and what to do, before any prompt is
sent; and what it asks each engine for is what that engine's own request model accepts (vLLM's and SGLang's
pydantic classes, under their own interpreters)."""

from __future__ import annotations

import http.server
import json
import os
import socket
import subprocess
import threading
from pathlib import Path

import pytest

from eaglepipe.answers.engine import (
    DIALECTS,
    EngineError,
    EngineServer,
    EngineSettings,
    check_returns_ids,
    running_engine,
)

REPO = Path(__file__).resolve().parent.parent


def settings(**overrides: object) -> EngineSettings:
    section = {"server": "vllm", "base_url": None, "model": None, "python": None, "gpus": 0, "args": [],
               "start_timeout_s": 30}
    return EngineSettings.from_section({**section, **overrides})


def closed_port_url() -> str:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return f"http://127.0.0.1:{port}/v1"


def test_an_unreachable_engine_url_is_one_line_naming_it(tmp_path: Path) -> None:
    url = closed_port_url()
    with pytest.raises(EngineError) as error, running_engine(
        settings(base_url=url), target_path="-", served_name="t", python="-", log_path=tmp_path / "log"
    ):
        pass
    message = str(error.value)
    assert "\n" not in message and url in message and "start it or fix the URL" in message


class PlainChatServer(http.server.BaseHTTPRequestHandler):
    """An OpenAI-compatible server that returns text only, as any server but vLLM's and SGLang's does."""

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        body = json.dumps({"id": "c", "object": "chat.completion", "choices": [
            {"index": 0, "message": {"role": "assistant", "content": "OK"}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 3, "completion_tokens": 1}}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def test_an_engine_that_returns_no_ids_stops_before_the_first_prompt() -> None:
    with http.server.ThreadingHTTPServer(("127.0.0.1", 0), PlainChatServer) as httpd:
        threading.Thread(target=httpd.serve_forever, daemon=True).start()
        url = f"http://127.0.0.1:{httpd.server_address[1]}/v1"
        with pytest.raises(EngineError) as error:
            check_returns_ids(EngineServer(url, "m", DIALECTS["vllm"]))
        httpd.shutdown()
    message = str(error.value)
    assert "\n" not in message and url in message and "returned no token ids" in message


def test_a_server_that_dies_while_starting_names_its_log(tmp_path: Path) -> None:
    log = tmp_path / "engine.log"
    broken = tmp_path / "python"
    broken.write_text("#!/bin/sh\necho 'CUDA out of memory' >&2\nexit 3\n")
    broken.chmod(0o755)
    with pytest.raises(EngineError) as error, running_engine(
        settings(python=str(broken)), target_path="m", served_name="t", python="unused", log_path=log
    ):
        pass
    message = str(error.value)
    assert "status 3" in message and "CUDA out of memory" in message and str(log) in message


ENGINE_CHECK = """
import json, sys
body = json.loads(sys.argv[2])
if sys.argv[1] == "vllm":
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
else:
    from sglang.srt.entrypoints.openai.protocol import ChatCompletionRequest
request = ChatCompletionRequest(**body)
print(json.dumps({key: getattr(request, key, None) for key in sys.argv[3].split(",")}))
"""


@pytest.mark.parametrize(
    ("engine", "stream", "expected"),
    [
        pytest.param("vllm", True, {"return_token_ids": True, "stream": True}, marks=pytest.mark.vllm),
        pytest.param("vllm", False, {"return_token_ids": True, "stream": False}, marks=pytest.mark.vllm),
        pytest.param("sglang", False, {"return_prompt_token_ids": True, "logprobs": True, "stream": False},
                     marks=pytest.mark.sglang),
    ],
)
def test_what_each_engine_is_asked_for_its_ids_is_what_its_own_request_model_reads(
    engine: str, stream: bool, expected: dict[str, object]
) -> None:
    python = REPO / f".venv-{engine}" / "bin" / "python"
    if not python.exists():
        pytest.fail(f"{python} is missing: run `make {engine}-env`")
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "stream": stream,
            "usage": {"include": True}, **DIALECTS[engine].request_fields(stream)}
    # SGLang imports torchvision, which its CPU environment lacks: tests/sglang_cpu stands in for it.
    env = {**os.environ, "PYTHONPATH": str(REPO / "tests" / "sglang_cpu")}
    run = subprocess.run([str(python), "-c", ENGINE_CHECK, engine, json.dumps(body), ",".join(expected)],
                         capture_output=True, text=True, timeout=300, env=env)
    assert run.returncode == 0, run.stderr[-3000:]
    assert json.loads(run.stdout.strip().splitlines()[-1]) == expected
