"""Run the target over the token ids and store EAGLE-3's inputs: three auxiliary layers and the last one.

Layers follow the "output of layer i" convention (HF `hidden_states[i + 1]`, taken by forward hooks);
the final state is taken after the model's final norm (what transformers returns last). Shards hold
whole samples, are planned from the token file alone, and are written atomically with a key in their
metadata, so a killed run reuses every finished shard and recomputes one only when its samples, model
or layers changed.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from eaglepipe.io import atomic_write, file_sha256, write_json
from eaglepipe.progress import StepProgress
from eaglepipe.target.load import load_target

log = logging.getLogger(__name__)


class HiddenError(ValueError):
    """A hidden-state stage problem, in one line."""


def default_aux_layers(num_layers: int) -> list[int]:
    return [1, num_layers // 2 - 1, num_layers - 4]


@dataclass(frozen=True)
class ShardPlan:
    index: int
    first: int  # first sample (row) of the shard
    last: int  # one past its last sample

    @property
    def name(self) -> str:
        return f"shard-{self.index:05d}.safetensors"


def plan_shards(offsets: list[int], shard_tokens: int) -> list[ShardPlan]:
    """Consecutive whole samples, each shard closed once it holds at least `shard_tokens` tokens."""
    plans, first = [], 0
    for row in range(len(offsets) - 1):
        if offsets[row + 1] - offsets[first] >= shard_tokens or row == len(offsets) - 2:
            plans.append(ShardPlan(len(plans), first, row + 1))
            first = row + 1
    return plans


def model_identity(target_dir: Path, target_name: str) -> dict[str, Any]:
    """Cheap but change-sensitive: config and tokenizer hashes plus weight sizes (hashing 600 GB is not)."""
    target_dir = Path(target_dir)
    hashed = {
        name: file_sha256(target_dir / name)
        for name in ("config.json", "tokenizer.json", "tokenizer_config.json", "tiktoken.model")
        if (target_dir / name).is_file()
    }
    weights = {p.name: p.stat().st_size for p in sorted(target_dir.glob("*.safetensors"))}
    return {"name": target_name, "files_sha256": hashed, "weight_bytes": weights}


def _shard_key(
    tokens: dict[str, torch.Tensor], plan: ShardPlan, prompt_ids: list[str], computed_by: list
) -> str:
    """Changes whenever the shard's samples (tokens, masks, boundaries, ids) or what computes them (model,
    layers, dtype) change."""
    start, end = int(tokens["offsets"][plan.first]), int(tokens["offsets"][plan.last])
    digest = hashlib.sha256()
    digest.update(tokens["input_ids"][start:end].numpy().tobytes())
    digest.update(tokens["loss_mask"][start:end].numpy().tobytes())
    digest.update((tokens["offsets"][plan.first : plan.last + 1] - start).numpy().tobytes())
    digest.update(json.dumps([prompt_ids[plan.first : plan.last], computed_by], sort_keys=True).encode())
    return digest.hexdigest()


def _existing_key(path: Path) -> str | None:
    if not path.is_file():
        return None
    try:
        with safe_open(str(path), framework="pt") as handle:
            return (handle.metadata() or {}).get("shard_key")
    except Exception:  # a torn or foreign file is simply recomputed
        return None


def decoder_of(model: torch.nn.Module) -> torch.nn.Module:
    """The transformer stack (its `layers` and final `norm`), without the lm_head: the head's
    full-vocabulary logits would cost more memory than all the states we keep (163,840 wide for Kimi)."""
    for module in model.modules():
        if isinstance(getattr(module, "layers", None), torch.nn.ModuleList) and hasattr(module, "norm"):
            return module
    raise HiddenError(f"{type(model).__name__}: no decoder with `layers` and `norm` to capture states from")


@torch.no_grad()
def capture_states(decoder: torch.nn.Module, layers: list[int], input_ids, attention_mask):
    """(aux [B, L, 3H], final [B, L, H]): outputs of the given layers, and the final-norm output.

    Forward hooks keep only these layers, where `output_hidden_states` would hold all of them.
    """
    captured: dict[int, torch.Tensor] = {}

    def keep(index: int):
        def hook(_module, _inputs, output):
            captured[index] = output[0] if isinstance(output, tuple) else output

        return hook

    handles = [decoder.layers[i].register_forward_hook(keep(i)) for i in layers]
    try:
        out = decoder(input_ids=input_ids, attention_mask=attention_mask, use_cache=False)
    finally:
        for handle in handles:
            handle.remove()
    return torch.cat([captured[i] for i in layers], dim=-1), out.last_hidden_state


def _forward_rows(
    model, tokens, rows: range, layers: list[int], batch_tokens: int, device, dtype, progress: StepProgress
):
    """Hidden states of whole samples, batched by padded token count."""
    decoder = decoder_of(model)
    offsets = tokens["offsets"]
    aux_parts, final_parts = [], []
    batch: list[int] = []

    def flush():
        width = max(int(offsets[r + 1] - offsets[r]) for r in batch)
        ids = torch.zeros(len(batch), width, dtype=torch.long)
        mask = torch.zeros(len(batch), width, dtype=torch.long)
        for i, r in enumerate(batch):
            seq = tokens["input_ids"][offsets[r] : offsets[r + 1]].long()
            ids[i, : len(seq)], mask[i, : len(seq)] = seq, 1
        aux, final = capture_states(decoder, layers, ids.to(device), mask.to(device))
        for i, r in enumerate(batch):
            n = int(offsets[r + 1] - offsets[r])
            aux_parts.append(aux[i, :n].to("cpu", dtype))
            final_parts.append(final[i, :n].to("cpu", dtype))
        done = sum(int(offsets[r + 1] - offsets[r]) for r in batch)
        progress.advance(done, done)
        batch.clear()

    for r in rows:
        length = int(offsets[r + 1] - offsets[r])
        longest = max([length] + [int(offsets[b + 1] - offsets[b]) for b in batch])
        if batch and longest * (len(batch) + 1) > batch_tokens:
            flush()
        batch.append(r)
    if batch:
        flush()
    return torch.cat(aux_parts), torch.cat(final_parts)


def extract_hidden(
    tokens_path: Path,
    token_stats_path: Path,
    target_dir: Path,
    shard_dir: Path,
    manifest_path: Path,
    *,
    target_name: str,
    aux_layers: list[int] | None = None,
    dtype: str = "bfloat16",
    device: str = "cpu",
    shard_tokens: int = 2_000_000,
    batch_tokens: int = 32768,
) -> dict[str, Any]:
    """Write (or reuse) every shard of one prompt set, then the manifest `hidden.done`. The row order's
    prompt ids come from the token stage's `tokens.json` (`token_stats_path`)."""
    tokens = load_file(str(tokens_path))
    prompt_ids = json.loads(Path(token_stats_path).read_text())["prompt_ids"]
    offsets = tokens["offsets"].tolist()
    if len(prompt_ids) != len(offsets) - 1:
        raise HiddenError(
            f"{tokens_path}: {len(offsets) - 1} rows but {token_stats_path} lists {len(prompt_ids)} ids: "
            "rerun the tokens rule"
        )
    identity = model_identity(target_dir, target_name)
    layers, hidden_size = resolve_layers(target_dir, aux_layers)
    storage_dtype = getattr(torch, dtype)
    shard_dir = Path(shard_dir)
    shard_dir.mkdir(parents=True, exist_ok=True)

    model = None
    entries = []
    started = time.monotonic()
    progress = StepProgress(log, f"{manifest_path}: hidden states", offsets[-1], unit="tokens")
    for plan in plan_shards(offsets, shard_tokens):
        path = shard_dir / plan.name
        key = _shard_key(tokens, plan, prompt_ids, [identity, layers, dtype])
        if _existing_key(path) == key:
            log.info("%s: reused (same tokens, model and layers)", path)
            progress.advance(offsets[plan.last] - offsets[plan.first], reused=True)
        else:
            if model is None:  # loaded only when some shard must be computed
                model = load_target(target_dir, dtype=dtype, device=device)[0]
            _write_shard(
                model, tokens, plan, path, key, layers, prompt_ids, batch_tokens, storage_dtype, progress
            )
        entries.append(_entry(path, plan, offsets, relative_to=Path(manifest_path).parent))
    manifest = {
        "shards": entries,
        "prompt_ids": prompt_ids,
        "num_samples": len(prompt_ids),
        "num_tokens": offsets[-1],
        "aux_layer_ids": layers,
        "layer_convention": "output",
        "final_norm": "after",
        "hidden_size": hidden_size,
        "dtype": dtype,
        "model": identity,
        "tokens_sha256": file_sha256(tokens_path),
        "seconds": round(time.monotonic() - started, 2),
    }
    write_json(manifest_path, manifest)
    return manifest


def resolve_layers(target_dir: Path, aux_layers: list[int] | None) -> tuple[list[int], int]:
    """The auxiliary layer ids (checked against the target's depth) and its hidden size, from config.json."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(str(target_dir))
    config = getattr(config, "text_config", config)  # multimodal targets (Kimi-K2.5) nest the LM config
    num_layers = config.num_hidden_layers
    layers = list(aux_layers) if aux_layers is not None else default_aux_layers(num_layers)
    if any(not 0 <= layer < num_layers for layer in layers):
        raise HiddenError(
            f"config key 'hidden.aux_layers' = {layers}: the target has layers 0..{num_layers - 1}"
        )
    return layers, config.hidden_size


def _write_shard(
    model, tokens, plan: ShardPlan, path: Path, key: str, layers, prompt_ids, batch_tokens, dtype, progress
) -> None:
    rows = range(plan.first, plan.last)
    device = next(model.parameters()).device
    aux, final = _forward_rows(model, tokens, rows, layers, batch_tokens, device, dtype, progress)
    start, end = int(tokens["offsets"][plan.first]), int(tokens["offsets"][plan.last])
    tensors = {
        "aux": aux.contiguous(),
        "final": final.contiguous(),
        "input_ids": tokens["input_ids"][start:end].clone(),
        "loss_mask": tokens["loss_mask"][start:end].clone(),
        "offsets": tokens["offsets"][plan.first : plan.last + 1] - start,
    }
    metadata = {
        "shard_key": key,
        "prompt_ids": json.dumps(prompt_ids[plan.first : plan.last]),
        "aux_layer_ids": json.dumps(layers),
    }
    atomic_write(path, lambda tmp: save_file(tensors, str(tmp), metadata=metadata))
    log.info("%s: %d samples, %d tokens", path, plan.last - plan.first, end - start)


def _entry(path: Path, plan: ShardPlan, offsets: list[int], relative_to: Path) -> dict[str, Any]:
    return {
        "path": os.path.relpath(path, relative_to),  # relative, so a results folder can be moved
        "sha256": file_sha256(path),
        "num_samples": plan.last - plan.first,
        "num_tokens": offsets[plan.last] - offsets[plan.first],
    }
