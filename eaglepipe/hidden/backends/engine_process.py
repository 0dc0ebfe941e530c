"""An engine in a process of its own, fed samples over a pipe: what the vLLM and SGLang backends share.

The worker (`vllm_worker`, `sglang_worker`) runs under the interpreter of the environment its engine is
installed in, reads one JSON request per line on stdin ({"samples": file, "out": file}) and answers on a
separate descriptor, since engines log to stdout. Floats travel as safetensors files on local disk, never
as JSON or Python lists: the answer file holds `hidden_states` [T, L, H] and `token_ids` [T], the ids the
engine actually prefilled. The engine's output is relayed line by line into the job's log.
"""

from __future__ import annotations

import collections
import json
import logging
import os
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any, TypedDict

import torch
from safetensors.torch import load_file, save_file
from torch import Tensor

import eaglepipe
from eaglepipe.hidden import HiddenError
from eaglepipe.hidden.backends import CapturedStates

log = logging.getLogger(__name__)


class WorkerReply(TypedDict, total=False):
    """One line on the reply descriptor: the engine is up, a request's answer file, or why it failed."""

    ready: bool
    out: str
    error: str


class EngineProcess:
    def __init__(self, name: str, python: str, module: str, arguments: list[str]) -> None:
        self.name = name
        self.python = python
        self.module = module
        self.arguments = arguments
        self._process: subprocess.Popen[str] | None = None
        self._replies: Any = None
        self._engine_log: collections.deque[str] = collections.deque(maxlen=30)
        self._scratch = tempfile.TemporaryDirectory(prefix=f"eaglepipe-{name}-")

    @property
    def scratch(self) -> Path:
        return Path(self._scratch.name)

    def start(self) -> None:
        read_fd, write_fd = os.pipe()
        command = [self.python, "-m", self.module, *self.arguments, "--reply-fd", str(write_fd)]
        # The engine's own worker processes import our modules too: the package must be importable in them.
        package_root = str(Path(eaglepipe.__file__).resolve().parent.parent)
        path = os.pathsep.join(filter(None, [package_root, os.environ.get("PYTHONPATH")]))
        try:
            self._process = subprocess.Popen(
                command,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                env={**os.environ, "PYTHONPATH": path},
                pass_fds=(write_fd,),
            )
        except OSError as err:
            raise HiddenError(
                f"config key 'hidden.engine_python' = {self.python}: cannot start it ({err})"
            ) from None
        finally:
            os.close(write_fd)
        self._replies = os.fdopen(read_fd)
        threading.Thread(target=self._relay_engine_log, daemon=True).start()
        self._expect("ready")

    def stop(self) -> None:
        if self._process is not None:
            if self._process.stdin:
                self._process.stdin.close()
            try:
                self._process.wait(timeout=120)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
        if self._replies is not None:
            self._replies.close()
        self._scratch.cleanup()

    def run(self, samples: list[Tensor]) -> tuple[Tensor, Tensor, Tensor]:
        """(hidden_states [T, L, H], token_ids [T], offsets [n + 1]) for the samples, in order."""
        offsets = torch.tensor([0] + [len(ids) for ids in samples]).cumsum(0)
        request = {
            "samples": str(self.scratch / "samples.safetensors"),
            "out": str(self.scratch / "states.safetensors"),
        }
        save_file({"input_ids": torch.cat(samples).long(), "offsets": offsets}, request["samples"])
        assert self._process is not None and self._process.stdin is not None
        self._process.stdin.write(json.dumps(request) + "\n")
        self._process.stdin.flush()
        self._expect("out")
        answer = load_file(request["out"])
        Path(request["out"]).unlink()
        if answer["hidden_states"].shape[0] != int(offsets[-1]):
            raise HiddenError(
                f"{self.name} returned states for {answer['hidden_states'].shape[0]} tokens, "
                f"{int(offsets[-1])} were sent: check the engine version against the pinned one"
            )
        return answer["hidden_states"], answer["token_ids"], offsets

    def _expect(self, key: str) -> WorkerReply:
        line = self._replies.readline()
        if not line:
            status = self._process.wait() if self._process else "?"
            tail = " | ".join(list(self._engine_log)[-5:])
            raise HiddenError(
                f"the {self.name} engine exited (status {status}): see the job log; last lines: {tail}"
            )
        message: WorkerReply = json.loads(line)
        if "error" in message:
            raise HiddenError(message["error"])
        if key not in message:
            raise HiddenError(f"the {self.name} engine answered {message}, expected {key!r}")
        return message

    def _relay_engine_log(self) -> None:
        assert self._process is not None and self._process.stdout is not None
        for line in self._process.stdout:
            line = line.rstrip()
            self._engine_log.append(line)
            log.info("%s: %s", self.name, line)


class EngineBackend:
    """A `StateBackend` whose engine runs in an `EngineProcess`: started once for the job, and answering
    [T, 4, H] stacks (the aux layers, then the engine's last-layer state) that `final_state` turns into the
    post-norm final state."""

    engine: EngineProcess

    def __enter__(self) -> EngineBackend:
        self.engine.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.engine.stop()

    def final_state(self, last: Tensor) -> Tensor:
        return last

    def states(self, samples: list[Tensor]) -> list[Any]:
        stacked, token_ids, offsets = self.engine.run(samples)
        aux, final = stacked[:, :-1].flatten(1), self.final_state(stacked[:, -1])
        return [
            CapturedStates(token_ids[a:b], aux[a:b], final[a:b])
            for a, b in zip(offsets[:-1].tolist(), offsets[1:].tolist(), strict=True)
        ]


class WorkerReplies:
    """The worker's side of the protocol: requests from stdin, answers on the reply descriptor."""

    def __init__(self, reply_fd: int) -> None:
        self._replies = os.fdopen(reply_fd, "w", buffering=1)

    def ready(self) -> None:
        self._send({"ready": True})

    def done(self, out: str) -> None:
        self._send({"out": out})

    def error(self, line: str) -> None:
        self._send({"error": line})

    @staticmethod
    def requests() -> Any:
        """(samples file, out file) per request line, until stdin closes."""
        for line in sys.stdin:
            request = json.loads(line)
            yield request["samples"], request["out"]

    def _send(self, message: WorkerReply) -> None:
        self._replies.write(json.dumps(message) + "\n")
