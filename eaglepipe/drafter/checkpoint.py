"""Training checkpoints: everything a killed training needs to go on as if it had not stopped.

One file, `latest.pt`, replaced atomically every `checkpoint_every` steps: the drafter's and the
optimizer's and scheduler's state, the data order (the epoch's shuffled batch order, the position in it and
the shuffling generator's state), the loss record and the torch RNG. It is only resumed when its
fingerprint (data manifests, held-out prompts, target, settings that shape training) matches this run's, so
a checkpoint of other data or settings is never continued. Removed once the drafter is exported.
"""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path
from typing import Any, TypedDict

import torch
from torch import Tensor

from eaglepipe.io import atomic_write
from eaglepipe.target.architecture import ModelConfig


class TrainingState(TypedDict):
    """Everything a killed training resumes from, at the end of step `step`. The optimizer's and the
    scheduler's are torch's own state dicts."""

    fingerprint: str
    step: int
    drafter: dict[str, Tensor]
    optimizer: dict[str, Any]
    scheduler: dict[str, Any]
    order_generator: Tensor
    torch_rng: Tensor
    epoch_order: list[int]
    position: int
    losses: list[float]
    tokens_seen: int
    window: list[tuple[Tensor, Tensor]]

log = logging.getLogger(__name__)
NAME = "latest.pt"
# Settings that do not change what is trained: a resumed run may differ in them.
NOT_SHAPING = ("checkpoint_every", "device")


def training_fingerprint(
    manifest_shas: list[str], holdout_ids: set[str], target_config: ModelConfig, settings: dict
) -> str:
    shaping = {k: v for k, v in settings.items() if k not in NOT_SHAPING}
    text = json.dumps([manifest_shas, sorted(holdout_ids), target_config, shaping], sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()


def save_checkpoint(directory: Path, state: TrainingState) -> None:
    path = Path(directory) / NAME
    atomic_write(path, lambda tmp: torch.save(state, tmp))
    log.info("%s: checkpoint at step %d", path, state["step"])


def load_checkpoint(directory: Path | None, fingerprint: str) -> TrainingState | None:
    """The latest checkpoint of this very training, or None (none, unreadable, or another training's)."""
    if directory is None:
        return None
    path = Path(directory) / NAME
    if not path.is_file():
        return None
    try:
        state = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as err:  # a torn file cannot exist (atomic writes), but a foreign one might
        log.warning("%s: unreadable (%s): training starts over", path, err)
        return None
    if state.get("fingerprint") != fingerprint:
        log.warning("%s: another training's (data, held-out prompts or settings differ): starting over", path)
        return None
    log.info("%s: resuming at step %d", path, state["step"])
    return state


def remove_checkpoint(directory: Path | None) -> None:
    if directory is not None:
        (Path(directory) / NAME).unlink(missing_ok=True)
