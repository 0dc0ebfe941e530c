"""vLLM's own hidden-state extraction (`extract_hidden_states`, as speculators and NeMo Automodel use it),
driven in a separate process under the interpreter of vLLM's environment (`vllm_worker`).

vLLM numbers layers "input of layer k": we ask for our aux layers as k = i + 1 and for k = N, the last
layer's output before the final norm, and apply the target's final RMSNorm ourselves in float32, so the
stored `final` is after the norm like every other backend's.
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
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from torch import Tensor

import eaglepipe
from eaglepipe.hidden import HiddenError
from eaglepipe.hidden.backends import BackendSettings, CapturedStates, TargetShape
from eaglepipe.target.layer_ids import vllm_capture_ids
from eaglepipe.target.weights import read_named_tensor

log = logging.getLogger(__name__)
FINAL_NORM = "model.norm.weight"  # Kimi-K2.5: language_model.model.norm.weight


def rms_norm(states: Tensor, weight: Tensor, eps: float) -> Tensor:
    """The target's final norm (Llama/DeepSeek RMSNorm), in float32."""
    states = states.float()
    return states * torch.rsqrt(states.pow(2).mean(-1, keepdim=True) + eps) * weight.float()


class VLLMBackend:
    def __init__(
        self,
        settings: BackendSettings,
        target_dir: Path,
        aux_layers: list[int],
        shape: TargetShape,
        longest_sample: int,
    ) -> None:
        self.settings = settings
        self.target_dir = Path(target_dir)
        self.shape = shape
        self.capture_ids = vllm_capture_ids(aux_layers, shape.num_layers)
        if self.capture_ids != sorted(self.capture_ids):
            raise HiddenError(f"config key 'hidden.aux_layers' = {aux_layers}: list them in increasing order")
        self.longest_sample = longest_sample
        self.norm_weight = read_named_tensor(self.target_dir, FINAL_NORM)
        self._process: subprocess.Popen[str] | None = None
        self._replies: Any = None
        self._engine_log: collections.deque[str] = collections.deque(maxlen=30)
        self._scratch = tempfile.TemporaryDirectory(prefix="eaglepipe-vllm-")

    def __enter__(self) -> VLLMBackend:
        python = self.settings.engine_python or sys.executable
        read_fd, write_fd = os.pipe()
        device = "cuda" if self.settings.gpus > 0 else "cpu"
        command = [
            python,
            "-m",
            "eaglepipe.hidden.backends.vllm_worker",
            "--target",
            str(self.target_dir),
            "--capture-ids",
            json.dumps(self.capture_ids),
            "--dtype",
            self.settings.compute_dtype,
            "--device",
            device,
            "--tensor-parallel",
            str(max(1, self.settings.gpus)),
            "--max-model-len",
            str(self.longest_sample + 1),
            "--memory-fraction",
            str(self.settings.engine_memory_fraction),
            "--storage",
            str(Path(self._scratch.name) / "vllm"),
            "--reply-fd",
            str(write_fd),
        ]
        # vLLM's spawned workers import the connector: the package must be importable in them too.
        package_root = str(Path(eaglepipe.__file__).resolve().parent.parent)
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(filter(None, [package_root, os.environ.get("PYTHONPATH")])),
        }
        log.info(
            "starting vLLM under %s (capture ids %s, %s, tensor parallel %d)",
            python,
            self.capture_ids,
            device,
            max(1, self.settings.gpus),
        )
        try:
            self._process = subprocess.Popen(
                command,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                env=env,
                pass_fds=(write_fd,),
            )
        except OSError as err:
            raise HiddenError(
                f"config key 'hidden.engine_python' = {python}: cannot start it ({err})"
            ) from None
        finally:
            os.close(write_fd)
        self._replies = os.fdopen(read_fd)
        threading.Thread(target=self._relay_engine_log, daemon=True).start()
        self._expect("ready")
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self._process is not None:
            if self._process.stdin:
                self._process.stdin.close()
            try:
                self._process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
        if self._replies is not None:
            self._replies.close()
        self._scratch.cleanup()

    def states(self, samples: list[Tensor]) -> list[CapturedStates]:
        scratch = Path(self._scratch.name)
        lengths = torch.tensor([0] + [len(ids) for ids in samples]).cumsum(0)
        request = {
            "samples": str(scratch / "samples.safetensors"),
            "out": str(scratch / "states.safetensors"),
        }
        save_file({"input_ids": torch.cat(samples).long(), "offsets": lengths}, request["samples"])
        assert self._process is not None and self._process.stdin is not None
        self._process.stdin.write(json.dumps(request) + "\n")
        self._process.stdin.flush()
        self._expect("out")
        answer = load_file(request["out"])
        Path(request["out"]).unlink()
        stacked, token_ids = answer["hidden_states"], answer["token_ids"]
        if stacked.shape[0] != int(lengths[-1]) or stacked.shape[1] != len(self.capture_ids):
            raise HiddenError(
                f"vLLM returned states {tuple(stacked.shape)} for {int(lengths[-1])} tokens and "
                f"{len(self.capture_ids)} layers: check the vLLM version (constraints-vllm.txt)"
            )
        aux = stacked[:, :-1].flatten(1)
        final = rms_norm(stacked[:, -1], self.norm_weight, self.shape.rms_norm_eps)
        return [
            CapturedStates(token_ids[a:b], aux[a:b], final[a:b])
            for a, b in zip(lengths[:-1].tolist(), lengths[1:].tolist(), strict=True)
        ]

    def _expect(self, key: str) -> dict[str, Any]:
        line = self._replies.readline()
        if not line:
            self._process.wait() if self._process else None
            tail = " | ".join(list(self._engine_log)[-5:])
            raise HiddenError(
                f"the vLLM engine exited (status {self._process.returncode if self._process else '?'})"
                f": see the job log; last lines: {tail}"
            )
        message = json.loads(line)
        if "error" in message:
            raise HiddenError(message["error"])
        if key not in message:
            raise HiddenError(f"the vLLM engine answered {message}, expected {key!r}")
        return message

    def _relay_engine_log(self) -> None:
        assert self._process is not None and self._process.stdout is not None
        for line in self._process.stdout:
            line = line.rstrip()
            self._engine_log.append(line)
            log.info("vllm: %s", line)
