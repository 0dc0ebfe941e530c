"""The team's own engine as a generation source: a vLLM or SGLang server, already running or started by the
job on the target, asked for the token ids it produced so the token stage has ground truth.

What each engine needs to return its ids was read in its own code (vLLM 0.32, SGLang 0.5.14): vLLM's
`/v1/chat/completions` takes `return_token_ids` and answers `choices[0].token_ids` and a top-level
`prompt_token_ids` (streamed: per chunk, and on the first chunk); SGLang's chat endpoint returns no completion
ids, so it is asked for `logprobs` (each entry's `bytes`, which the token stage maps to ids) and
`return_prompt_token_ids` (`choices[0].prompt_token_ids`, unstreamed answers only).
"""

from __future__ import annotations

import logging
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import httpx

from eaglepipe.answers.asked import AskedSet, ask_server, probe_loading
from eaglepipe.answers.job import AnswersJob
from eaglepipe.chat_api import ServerExtras
from eaglepipe.config import section_fields
from eaglepipe.config_types import EngineSection, Source
from eaglepipe.errors import EaglepipeError
from eaglepipe.openrouter.settings import EngineRequestParams, GenerationSettings
from eaglepipe.processes import die_with_parent, last_log_line, stop_process_group

log = logging.getLogger(__name__)

# A probe answer's length: enough to see ids come back, short enough to cost nothing.
PROBE_TOKENS = 2
POLL_S = 1.0


class EngineError(EaglepipeError):
    """An engine problem the user can fix, in one line naming the URL or the log and what to do."""


class EngineDialect(Protocol):
    """What differs between engines: how one is started, and what a request adds to get the ids back."""

    name: str
    # None: the answers stream as `generation.stream` says; False: this engine returns ids only unstreamed.
    stream: bool | None

    def command(self, python: str, target: str, model: str, port: int, gpus: int) -> list[str]: ...

    def request_fields(self, stream: bool) -> ServerExtras: ...

    def returned_ids(self, body: dict[str, Any]) -> bool:
        """Whether a (non-streamed) answer carries the completion's ids in this engine's form."""
        ...


class VllmDialect:
    name: str = "vllm"
    stream: bool | None = None

    def command(self, python: str, target: str, model: str, port: int, gpus: int) -> list[str]:
        parallel = ["--tensor-parallel-size", str(gpus)] if gpus > 1 else []
        return [python, "-m", "vllm.entrypoints.openai.api_server", "--model", target,
                "--served-model-name", model, "--host", "127.0.0.1", "--port", str(port), *parallel]

    def request_fields(self, stream: bool) -> ServerExtras:
        # vLLM refuses stream_options on an unstreamed request; streamed, usage comes only when asked.
        fields: ServerExtras = {"return_token_ids": True}
        if stream:
            fields["stream_options"] = {"include_usage": True}
        return fields

    def returned_ids(self, body: dict[str, Any]) -> bool:
        choice = (body.get("choices") or [{}])[0]
        return isinstance(choice.get("token_ids"), list)


class SglangDialect:
    name: str = "sglang"
    stream: bool | None = False

    def command(self, python: str, target: str, model: str, port: int, gpus: int) -> list[str]:
        parallel = ["--tp-size", str(gpus)] if gpus > 1 else []
        return [python, "-m", "sglang.launch_server", "--model-path", target, "--served-model-name", model,
                "--host", "127.0.0.1", "--port", str(port), *parallel]

    def request_fields(self, stream: bool) -> ServerExtras:
        return {"return_prompt_token_ids": True, "logprobs": True, "top_logprobs": 0}

    def returned_ids(self, body: dict[str, Any]) -> bool:
        choice = (body.get("choices") or [{}])[0]
        entries = (choice.get("logprobs") or {}).get("content") or []
        return bool(entries) and all(isinstance(entry.get("bytes"), list) for entry in entries)


DIALECTS: dict[str, EngineDialect] = {"vllm": VllmDialect(), "sglang": SglangDialect()}


@dataclass(frozen=True)
class EngineSettings:
    """The validated `engine` section."""

    server: str
    base_url: str | None
    model: str | None
    python: str | None
    gpus: int
    args: tuple[str, ...]
    start_timeout_s: float

    @classmethod
    def from_section(cls, section: EngineSection) -> EngineSettings:
        fields = section_fields(cls, section)
        return cls(**{**fields, "args": tuple(fields["args"])})

    @property
    def dialect(self) -> EngineDialect:
        return DIALECTS[self.server]


@dataclass(frozen=True)
class EngineServer:
    """A server the job may send requests to: where it listens and the model name it serves."""

    base_url: str
    model: str
    dialect: EngineDialect


@dataclass(frozen=True, kw_only=True)
class EngineAnswers:
    """`source: engine`: the same client, journal and resume as a bought set, against the team's own server;
    no key, no dollars, no routing."""

    asked: AskedSet
    request: EngineRequestParams
    engine: EngineSettings
    engine_log: Path

    @classmethod
    def from_rule(
        cls, inputs: Mapping[str, Any], params: Mapping[str, Any], logs: Mapping[str, Any], threads: int
    ) -> EngineAnswers:
        asked, request = AskedSet.from_rule(params), params["request"]
        engine = EngineSettings.from_section(asked.operational["engine"])
        if engine.server != request["server"]:
            raise EngineError(
                f"{params['settings']} is for a {engine.server} engine, the rule asks "
                f"{request['server']}: rerun `.venv/bin/snakemake generation_settings`"
            )
        return cls(asked=asked, request=request, engine=engine, engine_log=Path(logs["engine"]))

    def answer(self, job: AnswersJob) -> None:
        asked, engine = self.asked, self.engine
        shaping, operations = self.request["generation"], asked.operational["generation"]
        with (
            probe_loading(asked.target_path if operations["probe_answers"] else None) as probe,
            running_engine(
                engine,
                target_path=str(asked.target_path),
                served_name=self.request["target"],
                python=sys.executable,
                log_path=self.engine_log,
            ) as server,
        ):
            log.info(
                "%s: %s engine at %s serving %r", job.dataset, engine.server, server.base_url, server.model
            )
            stream = operations["stream"] if server.dialect.stream is None else server.dialect.stream
            settings = GenerationSettings.from_sections(
                {**shaping, **operations, "stream": stream, "return_token_ids": False, "logprobs": False},
                model=server.model,
                base_url=server.base_url,
                fingerprint=asked.fingerprint,
                kept=[],
                provider_obj=None,
                output_token_budget=job.output_token_budget,
                dollar_budget=None,
                max_failed_fraction=asked.max_failed_fraction,
                source=Source.ENGINE,
                server_name=engine.server,
                extra_request_fields=server.dialect.request_fields(stream),
            )
            ask_server(job, asked, settings, None, probe.result())


@contextmanager
def running_engine(
    engine: EngineSettings, *, target_path: str, served_name: str, python: str, log_path: Path
) -> Iterator[EngineServer]:
    """The configured server (checked to answer), or one started on the target for the block's duration
    with the job's GPUs; either way checked to return its token ids before any prompt is sent."""
    if engine.base_url is not None:
        base_url = engine.base_url.rstrip("/")
        server = EngineServer(base_url, engine.model or _served_model(base_url), engine.dialect)
        check_returns_ids(server)
        yield server
        return
    port = _free_port()
    model = engine.model or served_name
    command = [*engine.dialect.command(engine.python or python, target_path, model, port, engine.gpus),
               *engine.args]
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                   start_new_session=True, preexec_fn=die_with_parent)
    try:
        server = EngineServer(f"http://127.0.0.1:{port}/v1", model, engine.dialect)
        _wait_until_serving(server, process, engine.start_timeout_s, log_path)
        check_returns_ids(server)
        yield server
    finally:
        stop_process_group(process, grace_s=30.0)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _served_model(base_url: str) -> str:
    """The one model a running server lists; several need `engine.model` to say which."""
    models = [entry.get("id") for entry in _get(base_url, "/models").get("data") or []]
    if len(models) != 1:
        raise EngineError(
            f"{base_url}/models lists {models or 'no model'}: "
            "set engine.model to the served name of the target"
        )
    return str(models[0])


def _get(base_url: str, path: str) -> dict[str, Any]:
    try:
        response = httpx.get(base_url + path, timeout=10.0)
        response.raise_for_status()
        body = response.json()
    except (httpx.HTTPError, ValueError) as error:
        raise EngineError(
            f"engine.base_url {base_url}: no OpenAI-compatible server answers GET {path} "
            f"({type(error).__name__}: {error}); start it or fix the URL, then rerun"
        ) from None
    return body if isinstance(body, dict) else {}


def _wait_until_serving(
    server: EngineServer, process: subprocess.Popen, timeout_s: float, log_path: Path
) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        if process.poll() is not None:
            raise EngineError(
                f"the {server.dialect.name} server exited with status {process.returncode} while starting "
                f"({last_log_line(log_path)}): see {log_path}"
            )
        try:
            if httpx.get(server.base_url + "/models", timeout=5.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            raise EngineError(
                f"the {server.dialect.name} server did not answer within engine.start_timeout_s = "
                f"{timeout_s:g} s: see {log_path}; raise it for a large model"
            )
        time.sleep(POLL_S)


def check_returns_ids(server: EngineServer) -> None:
    """One short unstreamed request: an engine that does not return its ids would give the token stage
    nothing to check, so the set stops before its first prompt rather than after it."""
    body = {
        "model": server.model,
        "messages": [{"role": "user", "content": "Say OK."}],
        "max_tokens": PROBE_TOKENS,
        **server.dialect.request_fields(stream=False),
    }
    try:
        response = httpx.post(server.base_url + "/chat/completions", json=body, timeout=120.0)
        response.raise_for_status()
        answer = response.json()
    except (httpx.HTTPError, ValueError) as error:
        raise EngineError(
            f"{server.base_url}/chat/completions failed a short request for model {server.model!r} "
            f"({type(error).__name__}: {error}); check engine.model and the server's log, then rerun"
        ) from None
    if not server.dialect.returned_ids(answer):
        asked = sorted(server.dialect.request_fields(stream=False))
        raise EngineError(
            f"{server.base_url} returned no token ids when asked with {asked}: use a {server.dialect.name} "
            "version that does (vLLM >= 0.10.2) or set engine.server to the engine it is, then rerun"
        )
