"""The target pieces a drafter shares: its config, token embedding and lm_head.

They are read straight from the target's safetensors files, so training or loading the drafter of a
1T-parameter target does not load the target.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from safetensors import safe_open
from torch import Tensor

from eaglepipe.drafter import DrafterError


def read_target_config(target_dir: Path) -> dict[str, Any]:
    path = Path(target_dir) / "config.json"
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise DrafterError(
            f"{path}: cannot read the target config ({err}): is target_dir a model directory?"
        ) from None


def load_target_embeddings(target_dir: Path) -> tuple[Tensor, Tensor]:
    """(embed_tokens [vocab, H], lm_head [vocab, H]); a tied target's lm_head is its embedding."""
    target_dir = Path(target_dir)
    files = _weight_files(target_dir)
    embed = _read(target_dir, files, _only_name(target_dir, files, "embed_tokens.weight"))
    head_names = [name for name in files if name.endswith("lm_head.weight")]
    if len(head_names) == 1:
        return embed, _read(target_dir, files, head_names[0])
    config = read_target_config(target_dir)
    tied = config.get("tie_word_embeddings", (config.get("text_config") or {}).get("tie_word_embeddings"))
    if head_names or tied is False:
        raise DrafterError(f"{target_dir}: lm_head weights {head_names}: expected one, or a tied target")
    return embed, embed


def _weight_files(target_dir: Path) -> dict[str, str]:
    """Tensor name -> safetensors file name."""
    index = target_dir / "model.safetensors.index.json"
    if index.is_file():
        return json.loads(index.read_text())["weight_map"]
    single = target_dir / "model.safetensors"
    if not single.is_file():
        raise DrafterError(f"{target_dir}: no model.safetensors(.index.json): convert the target first")
    with safe_open(str(single), framework="pt") as tensors:
        return dict.fromkeys(tensors.keys(), single.name)


def _only_name(target_dir: Path, files: dict[str, str], suffix: str) -> str:
    names = [name for name in files if name.endswith(suffix)]
    if len(names) != 1:
        raise DrafterError(f"{target_dir}: expected one tensor named *{suffix}, found {names}")
    return names[0]


def _read(target_dir: Path, files: dict[str, str], name: str) -> Tensor:
    with safe_open(str(target_dir / files[name]), framework="pt") as tensors:
        return tensors.get_tensor(name)
