"""Single tensors and the config of a local target, read straight from its files: the drafter's frozen
embedding and head, or the final norm the hidden stage applies to an engine's pre-norm states, without
loading a 1T-parameter model."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from safetensors import safe_open
from torch import Tensor


class TargetFilesError(ValueError):
    """The target directory lacks what a stage reads from it: one line naming the file."""


def read_target_config(target_dir: Path) -> dict[str, Any]:
    path = Path(target_dir) / "config.json"
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise TargetFilesError(
            f"{path}: cannot read the target config ({err}): is target_dir a model directory?"
        ) from None


def text_config(config: dict[str, Any]) -> dict[str, Any]:
    """The language model's config: multimodal targets (Kimi-K2.5) nest it under `text_config`."""
    return config.get("text_config") or config


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


def only_name(target_dir: Path, files: dict[str, str], suffix: str) -> str:
    names = [name for name in files if name.endswith(suffix)]
    if len(names) != 1:
        raise TargetFilesError(f"{target_dir}: expected one tensor named *{suffix}, found {names}")
    return names[0]


def read_tensor(target_dir: Path, files: dict[str, str], name: str) -> Tensor:
    with safe_open(str(Path(target_dir) / files[name]), framework="pt") as tensors:
        return tensors.get_tensor(name)


def read_named_tensor(target_dir: Path, suffix: str) -> Tensor:
    """The one tensor whose name ends with `suffix` (e.g. `model.norm.weight`)."""
    files = weight_files(target_dir)
    return read_tensor(target_dir, files, only_name(target_dir, files, suffix))
