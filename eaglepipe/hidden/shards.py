"""Shard files: whole samples per shard, written atomically with a checksummed record beside them.

A shard is reused only when its record names the same key (same samples, model, layers, backend and
dtype) and the file still hashes to the recorded sha256, so a kill mid-write, a torn file or bit rot means
that shard alone is computed again.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file
from torch import Tensor

from eaglepipe.io import atomic_write, file_sha256, write_json

METADATA_KEY = "eaglepipe"
FP8 = torch.float8_e4m3fn
FP8_MAX = torch.finfo(FP8).max  # 448


@dataclass(frozen=True)
class ShardPlan:
    index: int
    first: int  # first sample (position in the selected rows) of the shard
    last: int  # one past its last sample

    @property
    def name(self) -> str:
        return f"shard-{self.index:05d}.safetensors"


def plan_shards(offsets: list[int], shard_tokens: int) -> list[ShardPlan]:
    """Consecutive whole samples, each shard closed once it holds at least `shard_tokens` tokens."""
    plans: list[ShardPlan] = []
    first = 0
    for row in range(len(offsets) - 1):
        if offsets[row + 1] - offsets[first] >= shard_tokens or row == len(offsets) - 2:
            plans.append(ShardPlan(len(plans), first, row + 1))
            first = row + 1
    return plans


def shard_key(samples: list[Tensor], masks: list[Tensor], prompt_ids: list[str], computed_by: Any) -> str:
    """Changes whenever the shard's samples (ids, masks, boundaries, prompt ids) or what computes and
    stores them change."""
    digest = hashlib.sha256()
    for ids, mask in zip(samples, masks, strict=True):
        digest.update(len(ids).to_bytes(8, "little"))
        digest.update(ids.to(torch.int32).numpy().tobytes())
        digest.update(mask.to(torch.uint8).numpy().tobytes())
    digest.update(json.dumps([prompt_ids, computed_by], sort_keys=True).encode())
    return digest.hexdigest()


def read_shard_metadata(metadata: dict[str, str] | None) -> dict[str, Any]:
    """{shard_key, prompt_ids, aux_layer_ids} from a shard's safetensors metadata ({} when absent)."""
    try:
        return json.loads((metadata or {})[METADATA_KEY])
    except (KeyError, ValueError):
        return {}


def record_path(shard: Path) -> Path:
    return shard.with_suffix(".json")


def reusable_entry(shard: Path, key: str) -> dict[str, Any] | None:
    """The manifest entry of a finished shard with this key whose bytes still match its record."""
    try:
        record = json.loads(record_path(shard).read_text())
    except (OSError, ValueError):
        return None
    if record.get("shard_key") != key or not shard.is_file() or file_sha256(shard) != record.get("sha256"):
        return None
    return {name: record[name] for name in ("sha256", "num_samples", "num_tokens")}


def encode_states(aux: Tensor, final: Tensor, dtype: str) -> dict[str, Tensor]:
    """Stored tensors. fp8 (e4m3) keeps one float32 scale per token and layer (its absolute maximum over
    448), so each token's vector uses fp8's full range whatever its magnitude."""
    if dtype != "fp8":
        return {
            "aux": aux.to(getattr(torch, dtype)).contiguous(),
            "final": final.to(getattr(torch, dtype)).contiguous(),
        }
    layers = aux.shape[1] // final.shape[1]
    aux_codes, aux_scale = _fp8(aux.float().reshape(aux.shape[0], layers, final.shape[1]))
    final_codes, final_scale = _fp8(final.float().unsqueeze(1))
    return {
        "aux": aux_codes.reshape(aux.shape).contiguous(),
        "aux_scale": aux_scale.contiguous(),
        "final": final_codes.reshape(final.shape).contiguous(),
        "final_scale": final_scale.contiguous(),
    }


def decode_states(
    tensors: dict[str, Tensor], out_dtype: torch.dtype = torch.float32
) -> tuple[Tensor, Tensor]:
    """(aux, final) as `out_dtype` from a shard's (or a slice of a shard's) stored tensors."""
    aux, final = tensors["aux"], tensors["final"]
    if aux.dtype != FP8:
        return aux.to(out_dtype), final.to(out_dtype)
    tokens, width = final.shape
    aux = aux.float().reshape(tokens, -1, width) * tensors["aux_scale"].unsqueeze(-1)
    final = final.float() * tensors["final_scale"]
    return aux.reshape(tokens, -1).to(out_dtype), final.to(out_dtype)


def _fp8(values: Tensor) -> tuple[Tensor, Tensor]:
    """values [T, L, H] -> (codes [T, L, H] fp8, scales [T, L] float32)."""
    scale = values.abs().amax(dim=-1).clamp(min=1e-12) / FP8_MAX
    return (values / scale.unsqueeze(-1)).to(FP8), scale


def write_shard(
    shard: Path,
    key: str,
    states: dict[str, Tensor],
    samples: list[Tensor],
    masks: list[Tensor],
    prompt_ids: list[str],
    aux_layer_ids: list[int],
) -> dict[str, Any]:
    """Write the shard atomically, then its record; returns the manifest entry."""
    lengths = torch.tensor([0] + [len(ids) for ids in samples], dtype=torch.int64)
    tensors = {
        **states,
        "input_ids": torch.cat(samples).to(torch.int32),
        "loss_mask": torch.cat(masks).to(torch.uint8),
        "offsets": lengths.cumsum(0),
    }
    about = {"shard_key": key, "prompt_ids": prompt_ids, "aux_layer_ids": aux_layer_ids}
    # One key: safetensors writes its metadata map in hash order, so several keys would make equal shards
    # differ byte for byte (and in their sha256) from one process to the next.
    metadata = {METADATA_KEY: json.dumps(about, sort_keys=True)}
    atomic_write(shard, lambda tmp: save_file(tensors, str(tmp), metadata=metadata))
    entry = {"sha256": file_sha256(shard), "num_samples": len(samples), "num_tokens": int(lengths.sum())}
    write_json(record_path(shard), {"shard_key": key, **entry})
    return entry


def manifest_entry(shard: Path, entry: dict[str, Any], manifest_dir: Path) -> dict[str, Any]:
    # relative, so a results folder can be moved
    return {"path": os.path.relpath(shard, manifest_dir), **entry}
