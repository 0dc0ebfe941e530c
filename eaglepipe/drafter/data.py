"""Training samples from the hidden-state shards, checked against the `hidden.done` manifests.

Opening a set reads every shard once (checksum, shapes, token counts) but keeps only an index; tensors
are read per batch from the memory-mapped files, so a set larger than memory trains the same way.
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open
from torch import Tensor

from eaglepipe.drafter import DrafterError
from eaglepipe.hidden.extract import HiddenManifest
from eaglepipe.hidden.shards import ManifestShard, StateCodec, read_shard_metadata, state_codec
from eaglepipe.io import file_sha256

SHARD_TENSORS = ("aux", "final", "input_ids", "loss_mask", "offsets")
STATE_SCALES = ("aux_scale", "final_scale")  # fp8, int4 and int3 shards: the scales of their codes


@dataclass(frozen=True)
class SampleRef:
    prompt_id: str
    shard: Path
    start: int
    stop: int
    source: int = 0  # index of the manifest (the prompt set) it came from

    @property
    def num_tokens(self) -> int:
        return self.stop - self.start


@dataclass
class TrainingSample:
    """One sample's ids, loss mask and hidden states, loaded from its shard for training."""

    prompt_id: str
    aux: Tensor  # [T, 3H], the shard's dtype (float32 for fp8, int4 and int3 shards, decoded)
    final: Tensor  # [T, H], after the target's final norm
    input_ids: Tensor  # int64 [T]
    loss_mask: Tensor  # bool [T], True on completion tokens


@dataclass
class HiddenData:
    samples: list[SampleRef]
    held_out: list[str]  # held-out prompt ids that had hidden states, in data order
    aux_layer_ids: list[int]
    hidden_size: int
    token_counts: Tensor  # int64 [max id + 1]: completion tokens of the kept samples, by target id
    dtype: str = "float32"  # hidden.dtype the shards were stored in

    @property
    def codec(self) -> StateCodec:
        return state_codec(self.dtype, self.hidden_size)


def open_hidden_data(manifests: list[Path], *, holdout_ids: set[str]) -> HiddenData:
    """Index the kept samples of every manifest; any mismatch names the file and the stage to rerun."""
    samples: list[SampleRef] = []
    held_out: list[str] = []
    counts = torch.zeros(0, dtype=torch.long)
    layout: tuple[list[int], int, str] | None = None
    for source, manifest_path in enumerate(manifests):
        manifest = _read_manifest(manifest_path)
        this_layout = (manifest["aux_layer_ids"], manifest["hidden_size"], manifest["dtype"])
        if layout is not None and this_layout != layout:
            raise DrafterError(
                f"{manifest_path}: aux_layer_ids/hidden_size/dtype {this_layout} differ from "
                f"{manifests[0]} {layout}: extract every set with the same target, layers and hidden.dtype"
            )
        layout = this_layout
        listed: list[str] = []
        for entry in manifest["shards"]:
            shard = manifest_path.parent / entry["path"]
            prompt_ids, offsets, input_ids, loss_mask = _check_shard(manifest_path, manifest, entry, shard)
            listed += prompt_ids
            for i, prompt_id in enumerate(prompt_ids):
                start, stop = int(offsets[i]), int(offsets[i + 1])
                if prompt_id in holdout_ids:
                    held_out.append(prompt_id)
                    continue
                samples.append(SampleRef(prompt_id, shard, start, stop, source))
                counts = _add_counts(counts, torch.bincount(input_ids[start:stop][loss_mask[start:stop]]))
        if listed != list(manifest["prompt_ids"]):
            raise DrafterError(f"{manifest_path}: prompt_ids differ from its shards': rerun the hidden stage")
    if layout is None:
        raise DrafterError("no hidden-state manifests given: list at least one hidden.done")
    return HiddenData(samples, held_out, list(layout[0]), layout[1], counts, layout[2])


def load_samples(refs: list[SampleRef], codec: StateCodec) -> list[TrainingSample]:
    """Read the samples' slices, in the order given; `codec`: how their shards store the states
    (HiddenData.codec)."""
    by_shard: dict[Path, list[int]] = defaultdict(list)
    for i, ref in enumerate(refs):
        by_shard[ref.shard].append(i)
    loaded: dict[int, TrainingSample] = {}
    for shard, indices in by_shard.items():
        with safe_open(str(shard), framework="pt") as tensors:
            stored = set(tensors.keys())  # safe_open supports no `in`
            names = [name for name in (*SHARD_TENSORS, *STATE_SCALES) if name in stored and name != "offsets"]
            slices = {name: tensors.get_slice(name) for name in names}
            for i in indices:
                ref = refs[i]
                rows = {name: piece[ref.start : ref.stop] for name, piece in slices.items()}
                aux, final = codec.decode(rows)
                loaded[i] = TrainingSample(
                    prompt_id=ref.prompt_id,
                    aux=aux,
                    final=final,
                    input_ids=rows["input_ids"].long(),
                    loss_mask=rows["loss_mask"].bool(),
                )
    return [loaded[i] for i in range(len(refs))]


def _add_counts(total: Tensor, more: Tensor) -> Tensor:
    if more.numel() > total.numel():
        total = torch.cat((total, total.new_zeros(more.numel() - total.numel())))
    total[: more.numel()] += more
    return total


def _read_manifest(path: Path) -> HiddenManifest:
    try:
        manifest: HiddenManifest = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise DrafterError(f"{path}: cannot read the manifest ({err}): rerun the hidden stage") from None
    for key in ("shards", "prompt_ids", "aux_layer_ids", "hidden_size", "dtype"):
        if key not in manifest:
            raise DrafterError(f"{path}: manifest lacks {key!r}: rerun the hidden stage")
    for key, expected in (("layer_convention", "output"), ("final_norm", "after")):
        if manifest.get(key) != expected:
            raise DrafterError(f"{path}: {key} is {manifest.get(key)!r}, training expects {expected!r}")
    return manifest


def _check_shard(
    manifest_path: Path, manifest: HiddenManifest, entry: ManifestShard, shard: Path
) -> tuple[list[str], Tensor, Tensor, Tensor]:
    """(prompt ids, offsets, input_ids, loss_mask) of a shard that matches its manifest entry."""
    if not shard.is_file():
        raise DrafterError(f"{manifest_path}: shard {shard} is missing: rerun the hidden stage")
    if file_sha256(shard) != entry["sha256"]:
        raise DrafterError(f"{shard}: sha256 differs from {manifest_path}: rerun the hidden stage")
    width = manifest["hidden_size"]
    tokens = entry["num_tokens"]
    expected = {
        **state_codec(manifest["dtype"], width).shapes(tokens),
        "input_ids": [tokens],
        "loss_mask": [tokens],
        "offsets": [entry["num_samples"] + 1],
    }
    with safe_open(str(shard), framework="pt") as tensors:
        available = set(tensors.keys())
        missing = [name for name in expected if name not in available]
        if missing:
            raise DrafterError(f"{shard}: lacks tensors {missing}: rerun the hidden stage")
        metadata = read_shard_metadata(tensors.metadata())
        shapes = {name: tensors.get_slice(name).get_shape() for name in expected}
        offsets = tensors.get_tensor("offsets").long()
        input_ids = tensors.get_tensor("input_ids").long()
        loss_mask = tensors.get_tensor("loss_mask").bool()
    prompt_ids = metadata.get("prompt_ids") or []
    consistent = (
        all(list(shape) == expected[name] for name, shape in shapes.items())
        and int(offsets[0]) == 0
        and int(offsets[-1]) == tokens
        and bool((offsets.diff() >= 0).all())
        and len(prompt_ids) == entry["num_samples"]
    )
    if not consistent:
        raise DrafterError(
            f"{shard}: tensors {shapes}, offsets or prompt_ids disagree with {manifest_path} "
            f"({entry['num_samples']} samples, {tokens} tokens, hidden {width}): rerun it"
        )
    if metadata.get("aux_layer_ids") != manifest["aux_layer_ids"]:
        raise DrafterError(f"{shard}: aux_layer_ids differ from {manifest_path}: rerun the hidden stage")
    return prompt_ids, offsets, input_ids, loss_mask
