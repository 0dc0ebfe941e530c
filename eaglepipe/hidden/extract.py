"""Run the target over a set's token ids and store EAGLE-3's inputs: three auxiliary layers and the last.

Shards hold whole samples and are planned from the token file and the caps alone, so a killed job
recomputes only the shards it had not finished, and the manifest of a resumed run equals that of an
uninterrupted one. Every sample's prefilled ids are checked against the token file before its states are
kept, and the job refuses to start when the disk cannot hold the shards still to write.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TypedDict

import torch
from torch import Tensor

from eaglepipe.config_types import HiddenSection
from eaglepipe.hidden import HiddenError
from eaglepipe.hidden.backends import (
    BACKENDS,
    ENGINE_BACKENDS,
    STORED,
    BackendSettings,
    CapturedStates,
    StateBackend,
)
from eaglepipe.hidden.backends.hf import HFBackend
from eaglepipe.hidden.backends.sglang import SGLangBackend
from eaglepipe.hidden.backends.vllm import VLLMBackend
from eaglepipe.hidden.shards import (
    ManifestShard,
    ShardEntry,
    ShardPlan,
    manifest_entry,
    plan_shards,
    reusable_entry,
    shard_key,
    state_codec,
    write_shard,
)
from eaglepipe.hidden.storage import PACKED_BITS, bytes_per_token, check_free_disk, select_rows
from eaglepipe.io import file_sha256, write_json
from eaglepipe.progress import StepProgress
from eaglepipe.target.architecture import TargetArchitecture
from eaglepipe.target.layer_ids import check_aux_layers, default_aux_layers
from eaglepipe.tokens.token_file import TokenFileError, read_token_rows


class ModelIdentity(TypedDict):
    """The target a manifest's states came from: its config and tokenizer hashes, its weights' sizes."""

    name: str
    files_sha256: dict[str, str]
    weight_bytes: dict[str, int]


class HiddenSubset(TypedDict):
    """The caps the set was extracted under, and the whole set it was drawn from."""

    max_samples: int | None
    max_tokens: int | None
    seed: int
    of_samples: int
    of_tokens: int


class HiddenManifest(TypedDict):
    """`hidden.done` (docs/formats.md): the set's shards and what computed them; the drafter and the
    figures read it."""

    shards: list[ManifestShard]
    prompt_ids: list[str]
    num_samples: int
    num_tokens: int
    subset: HiddenSubset
    aux_layer_ids: list[int]
    layer_convention: str
    final_norm: str
    backend: str
    stored: dict[str, str]
    hidden_size: int
    dtype: str
    model: ModelIdentity
    tokens_sha256: str

log = logging.getLogger(__name__)


@contextmanager
def open_backend(
    settings: BackendSettings,
    target_dir: Path,
    aux_layers: list[int],
    target: TargetArchitecture,
    longest_sample: int,
) -> Iterator[StateBackend]:
    """The backend, with its engine started once for the whole job (sized for `longest_sample` tokens) and
    shut down after it. Here, not in `backends/__init__`, which every backend imports."""
    if settings.name == "hf":
        yield HFBackend(settings, target_dir, aux_layers)
    elif settings.name == "vllm":
        with VLLMBackend(settings, target_dir, aux_layers, target, longest_sample) as backend:
            yield backend
    elif settings.name == "sglang":
        with SGLangBackend(settings, target_dir, aux_layers, target, longest_sample) as backend:
            yield backend
    else:
        raise ValueError(f"config key 'hidden.backend' = {settings.name!r}: choose one of {BACKENDS}")


@dataclass(frozen=True)
class HiddenSettings:
    """What the stage computes and stores: the `hidden` section of the config (all of it in the rule's
    params; schemas/config.schema.yaml holds the defaults) and the target's name."""

    target_name: str
    backend: BackendSettings
    aux_layers: list[int] | None
    dtype: str  # stored: float32 | bfloat16 | float16 | fp8 | int4 | int3
    shard_tokens: int
    max_samples: int | None
    max_tokens: int | None
    seed: int
    keep_free_gb: float

    @classmethod
    def from_section(cls, section: HiddenSection, *, target_name: str, gpus: int) -> HiddenSettings:
        """From the validated config's `hidden` section, the target's name and the GPUs the job got."""
        return cls(
            target_name=target_name,
            backend=BackendSettings(
                name=section["backend"],
                device=section["device"],
                gpus=gpus,
                compute_dtype=compute_dtype_for(section["dtype"], section["device"]),
                batch_tokens=section["batch_tokens"],
                engine_python=section["engine_python"],
                engine_memory_fraction=section["memory_fraction"],
            ),
            aux_layers=section["aux_layers"],
            dtype=section["dtype"],
            shard_tokens=section["shard_tokens"],
            max_samples=section["max_samples"],
            max_tokens=section["max_tokens"],
            seed=section["seed"],
            keep_free_gb=section["keep_free_gb"],
        )


def compute_dtype_for(dtype: str, device: str) -> str:
    """fp8, int4 and int3 are storage formats: the target runs in bf16 on GPUs, in float32 on the CPU (where
    bf16 has no fast path without AVX512-BF16, and which keeps the stored error the format's alone), and each
    token is encoded when stored."""
    if dtype == "fp8" or dtype in PACKED_BITS:
        return "float32" if device == "cpu" else "bfloat16"
    return dtype


@dataclass
class SetTokens:
    """The selected samples of one set, from the token stage's files."""

    prompt_ids: list[str]
    samples: list[Tensor]  # int64 ids per sample
    masks: list[Tensor]  # bool loss masks per sample
    of_samples: int
    of_tokens: int

    @property
    def offsets(self) -> list[int]:
        out = [0]
        for ids in self.samples:
            out.append(out[-1] + len(ids))
        return out


def read_set_tokens(tokens_path: Path, token_stats_path: Path, settings: HiddenSettings) -> SetTokens:
    try:
        tokens = read_token_rows(tokens_path, token_stats_path)
    except TokenFileError as error:
        raise HiddenError(str(error)) from None
    offsets = tokens.offsets
    lengths = [offsets[r + 1] - offsets[r] for r in range(len(tokens.prompt_ids))]
    rows = select_rows(
        tokens.prompt_ids,
        lengths,
        max_samples=settings.max_samples,
        max_tokens=settings.max_tokens,
        seed=settings.seed,
    )
    return SetTokens(
        prompt_ids=[tokens.prompt_ids[r] for r in rows],
        samples=[tokens.ids(r).long() for r in rows],
        masks=[tokens.mask(r).bool() for r in rows],
        of_samples=len(tokens.prompt_ids),
        of_tokens=offsets[-1],
    )


def extract_hidden(
    tokens_path: Path,
    token_stats_path: Path,
    target_dir: Path,
    shard_dir: Path,
    manifest_path: Path,
    settings: HiddenSettings,
) -> HiddenManifest:
    """Write (or reuse) every shard of one prompt set, then the manifest `hidden.done`. The row order's
    prompt ids come from the token stage's `tokens.json` (`token_stats_path`)."""
    target = TargetArchitecture.from_dir(target_dir)
    if settings.backend.name in ENGINE_BACKENDS:
        target.check_engines_agree()
    default = default_aux_layers(target.num_layers)
    layers = list(settings.aux_layers) if settings.aux_layers is not None else default
    check_aux_layers(layers, target.num_layers)
    data = read_set_tokens(tokens_path, token_stats_path, settings)
    if not data.samples:
        raise HiddenError(
            f"{tokens_path}: no samples to extract (caps hidden.max_samples/max_tokens too low?)"
        )
    shard_dir = Path(shard_dir)
    shard_dir.mkdir(parents=True, exist_ok=True)
    identity = model_identity(target_dir, settings.target_name)
    computed_by = [identity, layers, settings.dtype, settings.backend.name]
    offsets = data.offsets

    entries: dict[int, ShardEntry] = {}
    keys: dict[int, str] = {}
    plans = plan_shards(offsets, settings.shard_tokens)
    for plan in plans:
        keys[plan.index] = shard_key(
            data.samples[plan.first : plan.last],
            data.masks[plan.first : plan.last],
            data.prompt_ids[plan.first : plan.last],
            computed_by,
        )
        entry = reusable_entry(shard_dir / plan.name, keys[plan.index])
        if entry is not None:
            entries[plan.index] = entry
    missing = [plan for plan in plans if plan.index not in entries]
    missing_tokens = sum(offsets[p.last] - offsets[p.first] for p in missing)
    log.info(
        "%s: %d of %d shards already written and verified, %d to compute (%d tokens)",
        manifest_path,
        len(entries),
        len(plans),
        len(missing),
        missing_tokens,
    )
    check_free_disk(
        shard_dir, missing_tokens * bytes_per_token(target.hidden_size, settings.dtype), settings.keep_free_gb
    )

    started = time.monotonic()
    if missing:
        progress = StepProgress(log, f"{manifest_path}: hidden states", missing_tokens, unit="tokens")
        longest = max(len(ids) for p in missing for ids in data.samples[p.first : p.last])
        with open_backend(settings.backend, target_dir, layers, target, longest) as backend:
            for plan in missing:
                entries[plan.index] = _compute_shard(
                    backend,
                    data,
                    plan,
                    shard_dir,
                    keys[plan.index],
                    layers,
                    settings.dtype,
                    target.hidden_size,
                )
                tokens = offsets[plan.last] - offsets[plan.first]
                progress.advance(tokens, tokens)
        seconds = time.monotonic() - started
        log.info(
            "%s: computed %d tokens in %.1f s (%.0f tokens/s)",
            manifest_path,
            missing_tokens,
            seconds,
            missing_tokens / max(seconds, 1e-9),
        )
    manifest: HiddenManifest = {
        "shards": [
            manifest_entry(shard_dir / p.name, entries[p.index], Path(manifest_path).parent) for p in plans
        ],
        "prompt_ids": data.prompt_ids,
        "num_samples": len(data.samples),
        "num_tokens": offsets[-1],
        "subset": {
            "max_samples": settings.max_samples,
            "max_tokens": settings.max_tokens,
            "seed": settings.seed,
            "of_samples": data.of_samples,
            "of_tokens": data.of_tokens,
        },
        "aux_layer_ids": layers,
        "layer_convention": "output",
        "final_norm": "after",
        "backend": settings.backend.name,
        "stored": STORED[settings.backend.name],
        "hidden_size": target.hidden_size,
        "dtype": settings.dtype,
        "model": identity,
        "tokens_sha256": file_sha256(tokens_path),
    }
    write_json(manifest_path, manifest)
    return manifest


def _compute_shard(
    backend: StateBackend,
    data: SetTokens,
    plan: ShardPlan,
    shard_dir: Path,
    key: str,
    layers: list[int],
    dtype: str,
    hidden_size: int,
) -> ShardEntry:
    samples = data.samples[plan.first : plan.last]
    prompt_ids = data.prompt_ids[plan.first : plan.last]
    captured = backend.states(samples)
    if len(captured) != len(samples):
        raise HiddenError(
            f"{shard_dir / plan.name}: the {type(backend).__name__} returned states for {len(captured)} of "
            f"{len(samples)} samples: check the engine version against the pinned one"
        )
    for prompt_id, ids, states in zip(prompt_ids, samples, captured, strict=True):
        check_agreement(prompt_id, ids, states, hidden_size)
    aux = torch.cat([states.aux for states in captured])
    final = torch.cat([states.final for states in captured])
    entry = write_shard(
        shard_dir / plan.name,
        key,
        state_codec(dtype, final.shape[1]).encode(aux, final),
        samples,
        data.masks[plan.first : plan.last],
        prompt_ids,
        layers,
    )
    log.info("%s: %d samples, %d tokens", shard_dir / plan.name, entry["num_samples"], entry["num_tokens"])
    return entry


def check_agreement(prompt_id: str, expected: Tensor, states: CapturedStates, hidden_size: int) -> None:
    """The engine must have run exactly the token file's ids, or its states belong to another text."""
    seen = states.prefilled_ids.long()
    if len(seen) != len(expected) or not torch.equal(seen, expected.long()):
        differ = [i for i, (a, b) in enumerate(zip(seen.tolist(), expected.tolist(), strict=False)) if a != b]
        where = f"first at position {differ[0]}" if differ else f"lengths {len(seen)} vs {len(expected)}"
        raise HiddenError(
            f"prompt {prompt_id}: the engine prefilled other ids than tokens.safetensors ({where}): "
            "its states would not match the tokens; check the backend's tokenizer settings and rerun"
        )
    n = len(expected)
    if tuple(states.aux.shape) != (n, 3 * hidden_size) or tuple(states.final.shape) != (n, hidden_size):
        raise HiddenError(
            f"prompt {prompt_id}: the engine returned aux {tuple(states.aux.shape)} and final "
            f"{tuple(states.final.shape)} for {n} tokens of width {hidden_size}: check hidden.backend"
        )


def model_identity(target_dir: Path, target_name: str) -> ModelIdentity:
    """Cheap but change-sensitive: config and tokenizer hashes plus weight sizes (hashing 600 GB is not)."""
    target_dir = Path(target_dir)
    hashed = {
        name: file_sha256(target_dir / name)
        for name in ("config.json", "tokenizer.json", "tokenizer_config.json", "tiktoken.model")
        if (target_dir / name).is_file()
    }
    weights = {p.name: p.stat().st_size for p in sorted(target_dir.glob("*.safetensors"))}
    return {"name": target_name, "files_sha256": hashed, "weight_bytes": weights}
