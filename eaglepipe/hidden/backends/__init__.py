"""Engines that run the target over token ids and hand back EAGLE-3's states, behind one interface.

Every backend returns, per sample, the ids it actually prefilled (the driver checks them against the
token file), the three auxiliary layers' outputs in our convention (output of layer i) and the final
state after the target's final norm, converting where its engine stores something else.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import torch
from torch import Tensor

BACKENDS = ("hf", "sglang", "vllm")
# Backends that hand the target to a serving engine, which reads its config its own way.
ENGINE_BACKENDS = ("sglang", "vllm")


@dataclass
class CapturedStates:
    prefilled_ids: Tensor  # int64 [n]: what the engine ran, for the agreement check
    aux: Tensor  # [n, 3H]: outputs of the aux layers, low-mid-high
    final: Tensor  # [n, H]: after the final norm


@dataclass(frozen=True)
class BackendSettings:
    """How the states are computed (`HiddenSettings.from_section` builds it from the `hidden` section)."""

    name: str  # hf | sglang | vllm
    device: str  # hf: cpu, cuda or auto (spread over all GPUs)
    gpus: int  # GPUs the job was given: the engines' tensor-parallel size
    compute_dtype: str
    batch_tokens: int
    engine_python: str | None  # vllm: the interpreter of the environment vLLM is installed in
    engine_memory_fraction: float


# For the manifest: which physical tensors each backend captures, and how `final` ends up after the norm.
STORED = {
    "hf": {
        "aux": "output of decoder layer i (forward hook) = HF hidden_states[i + 1]",
        "final": "decoder output after the final norm = HF hidden_states[-1]",
    },
    "vllm": {
        "aux": "vLLM extract_hidden_states id i + 1 (input of layer i + 1) = output of layer i",
        "final": "vLLM id N (last layer's output, before the final norm), final RMSNorm applied in float32",
    },
    "sglang": {
        "aux": "SGLang set_eagle3_layers_to_capture(i) (input of layer i + 1) = output of layer i",
        "final": "SGLang's hidden state at the logits step, after the final norm",
    },
}


class StateBackend(Protocol):
    def states(self, samples: list[Tensor]) -> list[CapturedStates]: ...


def memory_problem(target_dir: str | Path, gpus: int, fraction: float, per_gpu_bytes: int) -> str | None:
    """Why the target's weights cannot fit the engine's share of the job's GPUs (with a tenth left for
    activations and the KV cache), or None."""
    weights = sum(path.stat().st_size for path in Path(target_dir).glob("*.safetensors"))
    usable = gpus * per_gpu_bytes * fraction
    if weights <= 0.9 * usable:
        return None
    return (
        f"{target_dir}: the weights take {weights / 1e9:,.1f} GB but {gpus} GPU(s) x "
        f"{per_gpu_bytes / 1e9:,.0f} GB x hidden.memory_fraction {fraction:g} leave {usable / 1e9:,.1f} GB: "
        "raise hidden.gpus, or run on GPUs with more memory"
    )


def gpu_memory_problem(target_dir: str | Path, gpus: int, fraction: float) -> str | None:
    """`memory_problem` for this machine's first GPU (the engines' workers ask it before loading)."""
    return memory_problem(target_dir, gpus, fraction, torch.cuda.get_device_properties(0).total_memory)
