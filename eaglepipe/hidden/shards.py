"""Shard files: whole samples per shard, written atomically with a checksummed record beside them.

A shard is reused only when its record names the same key (same samples, model, layers, backend and
dtype) and the file still hashes to the recorded sha256, so a kill mid-write, a torn file or bit rot means
that shard alone is computed again.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypedDict

import torch
from safetensors.torch import save_file
from torch import Tensor

from eaglepipe.hidden.storage import PACKED_BITS, group_size
from eaglepipe.io import atomic_write, file_sha256, write_json


class ShardMetadata(TypedDict, total=False):
    """What a shard's safetensors metadata says of it (nothing, for a shard written without it)."""

    shard_key: str
    prompt_ids: list[str]
    aux_layer_ids: list[int]


class ShardEntry(TypedDict):
    """A finished shard as its record (`.json` beside it, with its key) and the manifest list it."""

    sha256: str
    num_samples: int
    num_tokens: int


class ManifestShard(ShardEntry):
    """One of the manifest's `shards`: the entry and where the shard is, relative to the manifest."""

    path: str

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


def read_shard_metadata(metadata: dict[str, str] | None) -> ShardMetadata:
    """{shard_key, prompt_ids, aux_layer_ids} from a shard's safetensors metadata ({} when absent)."""
    try:
        about: ShardMetadata = json.loads((metadata or {})[METADATA_KEY])
        return about
    except (KeyError, ValueError):
        return {}


def record_path(shard: Path) -> Path:
    return shard.with_suffix(".json")


def reusable_entry(shard: Path, key: str) -> ShardEntry | None:
    """The manifest entry of a finished shard with this key whose bytes still match its record."""
    try:
        record = json.loads(record_path(shard).read_text())
    except (OSError, ValueError):
        return None
    if record.get("shard_key") != key or not shard.is_file() or file_sha256(shard) != record.get("sha256"):
        return None
    return {
        "sha256": record["sha256"],
        "num_samples": record["num_samples"],
        "num_tokens": record["num_tokens"],
    }


class StateCodec(Protocol):
    """How a shard stores the three aux layers and the final state (`hidden.dtype`)."""

    def encode(self, aux: Tensor, final: Tensor) -> dict[str, Tensor]:
        """aux [T, 3H], final [T, H] -> the shard's state tensors."""
        ...

    def decode(self, tensors: Mapping[str, Tensor]) -> tuple[Tensor, Tensor]:
        """(aux [T, 3H], final [T, H]) from a shard's (or a slice of a shard's) state tensors."""
        ...

    def shapes(self, tokens: int) -> dict[str, list[int]]:
        """The state tensors a shard of `tokens` tokens holds, by name."""
        ...


@dataclass(frozen=True)
class PlainStates:
    """The states as a torch dtype (float32, bfloat16, float16), decoded as stored."""

    dtype: str
    hidden_size: int

    def encode(self, aux: Tensor, final: Tensor) -> dict[str, Tensor]:
        dtype = getattr(torch, self.dtype)
        return {"aux": aux.to(dtype).contiguous(), "final": final.to(dtype).contiguous()}

    def decode(self, tensors: Mapping[str, Tensor]) -> tuple[Tensor, Tensor]:
        return tensors["aux"], tensors["final"]

    def shapes(self, tokens: int) -> dict[str, list[int]]:
        return {"aux": [tokens, 3 * self.hidden_size], "final": [tokens, self.hidden_size]}


@dataclass(frozen=True)
class Fp8States:
    """fp8 (e4m3) with one float32 scale per token and layer (its absolute maximum over 448), so each
    token's vector uses fp8's full range whatever its magnitude."""

    hidden_size: int

    def encode(self, aux: Tensor, final: Tensor) -> dict[str, Tensor]:
        layers = aux.shape[1] // self.hidden_size
        aux_codes, aux_scale = _fp8(aux.float().reshape(aux.shape[0], layers, self.hidden_size))
        final_codes, final_scale = _fp8(final.float().unsqueeze(1))
        return {
            "aux": aux_codes.reshape(aux.shape).contiguous(),
            "aux_scale": aux_scale.contiguous(),
            "final": final_codes.reshape(final.shape).contiguous(),
            "final_scale": final_scale.contiguous(),
        }

    def decode(self, tensors: Mapping[str, Tensor]) -> tuple[Tensor, Tensor]:
        aux, final = tensors["aux"], tensors["final"]
        tokens = final.shape[0]
        aux = aux.float().reshape(tokens, -1, self.hidden_size) * tensors["aux_scale"].unsqueeze(-1)
        return aux.reshape(tokens, -1), final.float() * tensors["final_scale"]

    def shapes(self, tokens: int) -> dict[str, list[int]]:
        return {
            "aux": [tokens, 3 * self.hidden_size],
            "aux_scale": [tokens, 3],
            "final": [tokens, self.hidden_size],
            "final_scale": [tokens, 1],
        }


@dataclass(frozen=True)
class GroupCodes:
    """`bits`-bit codes with one bfloat16 scale per group of values (storage.group_size), packed eight
    codes to `bits` bytes.

    Each group is first turned by the orthonormal Hadamard matrix of its size: a target's hidden states
    carry a few channels hundreds of times larger than the rest, which would set their group's scale and
    round its other values to nothing; turned, the outlier's weight spreads over the group. The levels sit
    at odd multiples of half a step around zero, (code - (2^bits - 1) / 2) x scale, the group's absolute
    maximum on the outermost, so all 2^bits codes are used. A bfloat16 scale has float32's range, so no
    outlier overflows it; the codes are rounded against that stored scale.
    """

    bits: int
    hidden_size: int

    @property
    def group(self) -> int:
        return group_size(self.hidden_size)

    @property
    def half(self) -> float:
        return (2**self.bits - 1) / 2

    @functools.cached_property
    def rotation(self) -> Tensor:
        """Sylvester's Hadamard matrix over sqrt(group): symmetric and orthonormal, its own inverse."""
        matrix = torch.ones(1, 1)
        while len(matrix) < self.group:
            matrix = torch.cat([torch.cat([matrix, matrix], 1), torch.cat([matrix, -matrix], 1)])
        return matrix / math.sqrt(self.group)

    def encode(self, aux: Tensor, final: Tensor) -> dict[str, Tensor]:
        aux_codes, aux_scale = self._quantize(aux)
        final_codes, final_scale = self._quantize(final)
        return {"aux": aux_codes, "aux_scale": aux_scale, "final": final_codes, "final_scale": final_scale}

    def decode(self, tensors: Mapping[str, Tensor]) -> tuple[Tensor, Tensor]:
        return (
            self._dequantize(tensors["aux"], tensors["aux_scale"]),
            self._dequantize(tensors["final"], tensors["final_scale"]),
        )

    def shapes(self, tokens: int) -> dict[str, list[int]]:
        codes, scales = self.hidden_size * self.bits // 8, self.hidden_size // self.group
        return {
            "aux": [tokens, 3 * codes],
            "aux_scale": [tokens, 3 * scales],
            "final": [tokens, codes],
            "final_scale": [tokens, scales],
        }

    def _quantize(self, states: Tensor) -> tuple[Tensor, Tensor]:
        """[T, k*H] -> (packed codes uint8 [T, k*H*bits/8], scales bfloat16 [T, k*H/group]); a few
        thousand tokens at a time, so a shard's worth never needs its int64 packing words at once."""
        codes, scales = [], []
        for chunk in states.split(QUANTIZE_CHUNK_TOKENS):
            groups = chunk.float().reshape(len(chunk), -1, self.group) @ self.rotation
            scale = (groups.abs().amax(-1) / self.half).clamp(min=torch.finfo(torch.bfloat16).tiny)
            scale = scale.to(torch.bfloat16)
            level = (groups / scale.float().unsqueeze(-1) + self.half).round().clamp(0, 2**self.bits - 1)
            codes.append(self._pack(level.to(torch.uint8).reshape(len(chunk), -1)))
            scales.append(scale)
        return torch.cat(codes).contiguous(), torch.cat(scales).contiguous()

    def _dequantize(self, packed: Tensor, scale: Tensor) -> Tensor:
        level = self._unpack(packed).float().reshape(len(packed), -1, self.group)
        turned = (level - self.half) * scale.float().unsqueeze(-1)
        return (turned @ self.rotation).reshape(len(packed), -1)

    def _pack(self, codes: Tensor) -> Tensor:
        """[T, N] codes below 2^bits -> [T, N*bits/8] bytes: eight codes make one little-endian word."""
        eights = codes.reshape(len(codes), -1, 8).long()
        word = (eights << (self.bits * torch.arange(8))).sum(-1, keepdim=True)
        packed = (word >> (8 * torch.arange(self.bits))) & 0xFF
        return packed.to(torch.uint8).reshape(len(codes), -1)

    def _unpack(self, packed: Tensor) -> Tensor:
        words = packed.reshape(len(packed), -1, self.bits).long()
        word = (words << (8 * torch.arange(self.bits))).sum(-1, keepdim=True)
        codes = (word >> (self.bits * torch.arange(8))) & (2**self.bits - 1)
        return codes.reshape(len(packed), -1)


# Tokens quantized at once: bounds the int64 packing words (8 B a value) to a few hundred MB at 7168 wide.
QUANTIZE_CHUNK_TOKENS = 2048


def state_codec(dtype: str, hidden_size: int) -> StateCodec:
    """The codec of `hidden.dtype` for states `hidden_size` wide."""
    if dtype == "fp8":
        return Fp8States(hidden_size)
    if dtype in PACKED_BITS:
        group_size(hidden_size)  # a width the groups cannot tile is refused before any state is computed
        return GroupCodes(PACKED_BITS[dtype], hidden_size)
    return PlainStates(dtype, hidden_size)


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
) -> ShardEntry:
    """Write the shard atomically, then its record; returns the manifest entry."""
    lengths = torch.tensor([0] + [len(ids) for ids in samples], dtype=torch.int64)
    tensors = {
        **states,
        "input_ids": torch.cat(samples).to(torch.int32),
        "loss_mask": torch.cat(masks).to(torch.uint8),
        "offsets": lengths.cumsum(0),
    }
    about: ShardMetadata = {"shard_key": key, "prompt_ids": prompt_ids, "aux_layer_ids": aux_layer_ids}
    # One key: safetensors writes its metadata map in hash order, so several keys would make equal shards
    # differ byte for byte (and in their sha256) from one process to the next.
    metadata = {METADATA_KEY: json.dumps(about, sort_keys=True)}
    atomic_write(shard, lambda tmp: save_file(tensors, str(tmp), metadata=metadata))
    entry: ShardEntry = {
        "sha256": file_sha256(shard),
        "num_samples": len(samples),
        "num_tokens": int(lengths.sum()),
    }
    write_json(record_path(shard), {"shard_key": key, **entry})
    return entry


def manifest_entry(shard: Path, entry: ShardEntry, manifest_dir: Path) -> ManifestShard:
    # relative, so a results folder can be moved
    return {"path": os.path.relpath(shard, manifest_dir), **entry}
