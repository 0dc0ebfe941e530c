"""vLLM's own hidden-state extraction (`extract_hidden_states`, as speculators and NeMo Automodel use it),
driven in a separate process under the interpreter of vLLM's environment (`vllm_worker`).

vLLM numbers layers "input of layer k": we ask for our aux layers as k = i + 1 and for k = N, the last
layer's output before the final norm, and apply the target's final RMSNorm ourselves in float32, so the
stored `final` is after the norm like every other backend's.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from torch import Tensor

from eaglepipe.hidden import HiddenError
from eaglepipe.hidden.backends import BackendSettings
from eaglepipe.hidden.backends.engine_process import EngineBackend, EngineProcess
from eaglepipe.target.architecture import TargetArchitecture
from eaglepipe.target.layer_ids import vllm_capture_ids
from eaglepipe.target.weights import read_tensor


def rms_norm(states: Tensor, weight: Tensor, eps: float) -> Tensor:
    """The target's final norm (Llama/DeepSeek RMSNorm), in float32."""
    states = states.float()
    return states * torch.rsqrt(states.pow(2).mean(-1, keepdim=True) + eps) * weight.float()


class VLLMBackend(EngineBackend):
    def __init__(
        self,
        settings: BackendSettings,
        target_dir: Path,
        aux_layers: list[int],
        target: TargetArchitecture,
        longest_sample: int,
    ) -> None:
        self.target = target
        capture_ids = vllm_capture_ids(aux_layers, target.num_layers)
        if capture_ids != sorted(capture_ids):  # vLLM stores the layers in ascending id order
            raise HiddenError(f"config key 'hidden.aux_layers' = {aux_layers}: list them in increasing order")
        self.norm_weight = read_tensor(Path(target_dir), target.final_norm_weight)
        gpus = settings.gpus
        self.engine = EngineProcess(
            "vllm",
            settings.engine_python or sys.executable,
            "eaglepipe.hidden.backends.vllm_worker",
            [
                "--target",
                str(target_dir),
                "--capture-ids",
                json.dumps(capture_ids),
                "--dtype",
                settings.compute_dtype,
                "--device",
                "cuda" if gpus > 0 else "cpu",
                "--tensor-parallel",
                str(max(1, gpus)),
                "--max-model-len",
                str(longest_sample + 1),
                "--memory-fraction",
                str(settings.engine_memory_fraction),
            ],
        )
        self.engine.arguments += ["--storage", str(self.engine.scratch / "vllm")]
        if target.text_only:
            self.engine.arguments.append("--language-model-only")
        if target.uses_mla:
            self.engine.arguments.append("--mla")

    def final_state(self, last: Tensor) -> Tensor:
        """vLLM's last layer is before the final norm; the stored `final` is after it."""
        return rms_norm(last, self.norm_weight, self.target.rms_norm_eps)
