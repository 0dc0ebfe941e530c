"""Single tensors of a local target, read straight from its safetensors files: the drafter's frozen
embedding and head, or the final norm the hidden stage applies to an engine's pre-norm states, without
loading a 1T-parameter model. Tensor names come from `architecture.TargetArchitecture`."""

from __future__ import annotations

import json
from pathlib import Path

from safetensors import safe_open
from torch import Tensor

from eaglepipe.errors import EaglepipeError


class TargetFilesError(EaglepipeError, ValueError):
    """The target directory lacks what a stage reads from it: one line naming the file."""


def weight_files(target_dir: Path) -> dict[str, str]:
    """Tensor name -> safetensors file name."""
    target_dir = Path(target_dir)
    index = target_dir / "model.safetensors.index.json"
    if index.is_file():
        return json.loads(index.read_text())["weight_map"]
    single = target_dir / "model.safetensors"
    if not single.is_file():
        raise TargetFilesError(f"{target_dir}: no model.safetensors(.index.json): convert the target first")
    with safe_open(str(single), framework="pt") as tensors:
        return dict.fromkeys(tensors.keys(), single.name)


def read_tensor(target_dir: Path, name: str, files: dict[str, str] | None = None) -> Tensor:
    """The tensor `name` (e.g. `language_model.model.norm.weight`); `files` saves re-reading the index."""
    files = weight_files(target_dir) if files is None else files
    if name not in files:
        raise TargetFilesError(
            f"{target_dir}: no tensor {name!r} in the weights: is this the target's checkpoint?"
        )
    with safe_open(str(Path(target_dir) / files[name]), framework="pt") as tensors:
        return tensors.get_tensor(name)
