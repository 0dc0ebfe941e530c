"""The checkpoint SGLang and vLLM load as an EAGLE-3 draft model, and a loader that reads it SGLang's way.

`load_exported` does not reuse the training module's parameter names: like SGLang's `LlamaForCausalLMEagle3`
it stacks q/k/v into `qkv_proj` and gate/up into `gate_up_proj` and computes with the fused layout, so a
round trip that reproduces the logits shows the served layout computes what was trained.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypedDict

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from torch import Tensor, nn

from eaglepipe.drafter import DrafterError
from eaglepipe.drafter.frozen import load_target_embeddings
from eaglepipe.drafter.model import Eagle3Config, Eagle3Drafter, PackedRows, self_attention
from eaglepipe.io import atomic_write, write_json
from eaglepipe.target.layer_ids import (
    ServedLayerKeys,
    aux_layers_as_read,
    check_engines_agree,
    served_config_keys,
)

ARCHITECTURE = "LlamaForCausalLMEagle3"
NOT_EXPORTED = ("embed_tokens.weight",)  # the server takes the target's embedding
# SGLang's stacked_params_mapping for Llama: (fused parameter, checkpoint piece, shard id)
STACKED_PARAMS = (
    ("qkv_proj", "q_proj", "q"),
    ("qkv_proj", "k_proj", "k"),
    ("qkv_proj", "v_proj", "v"),
    ("gate_up_proj", "gate_proj", 0),
    ("gate_up_proj", "up_proj", 1),
)


class TransformerLayerConfig(TypedDict):
    """The draft layer's Llama config: the part of config.json the speculators format copies."""

    model_type: str
    num_hidden_layers: int
    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: None
    max_position_embeddings: int
    vocab_size: int
    hidden_act: str
    tie_word_embeddings: bool


class DrafterConfigJson(TransformerLayerConfig, ServedLayerKeys):
    """The exported drafter's config.json: a one-layer Llama config with EAGLE-3's keys."""

    architectures: list[str]
    draft_vocab_size: int
    target_hidden_size: int
    torch_dtype: str


def config_json(config: Eagle3Config) -> DrafterConfigJson:
    check_engines_agree(config.aux_layer_ids)
    return {
        "architectures": [ARCHITECTURE],
        "model_type": "llama",
        "hidden_size": config.hidden_size,
        "intermediate_size": config.intermediate_size,
        "num_attention_heads": config.num_attention_heads,
        "num_key_value_heads": config.num_key_value_heads,
        "head_dim": config.head_dim,
        "num_hidden_layers": 1,
        "hidden_act": "silu",
        "rms_norm_eps": config.rms_norm_eps,
        "rope_theta": config.rope_theta,
        "rope_scaling": None,
        "max_position_embeddings": config.max_position_embeddings,
        "vocab_size": config.vocab_size,
        "draft_vocab_size": config.draft_vocab_size,
        "target_hidden_size": config.target_hidden_size,
        "tie_word_embeddings": False,
        **served_config_keys(config.aux_layer_ids),
        "torch_dtype": config.torch_dtype,
    }


def export_drafter(model: Eagle3Drafter, out_dir: Path) -> None:
    """Write `config.json` and `model.safetensors` (floats in `config.torch_dtype`), each atomically."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    dtype = getattr(torch, model.config.torch_dtype)
    tensors = {
        name: (t.to(dtype) if t.is_floating_point() else t).detach().cpu().contiguous()
        for name, t in model.state_dict().items()
        if name not in NOT_EXPORTED
    }
    metadata = {"format": "pt"}
    atomic_write(out_dir / "model.safetensors", lambda tmp: save_file(tensors, str(tmp), metadata=metadata))
    write_json(out_dir / "config.json", config_json(model.config))


@dataclass(frozen=True)
class TargetReference:
    """How a serving node finds the drafter's target. A drafter is trained on one machine and served on
    another, so the engines get `name` (a hub id, or whatever the serving node resolves: a name in its
    Hugging Face cache, a path there); the training node's `path` is provenance only. `local_only`: the
    target was built on the training node (an embedded one), so no hub has it under `name`: carry it."""

    name: str
    path: str
    local_only: bool

    def write(self, path: Path) -> None:
        write_json(path, {"name": self.name, "trained_with": self.path, "local_only": self.local_only})

    @classmethod
    def read(cls, path: Path) -> TargetReference:
        try:
            record = json.loads(path.read_text())
            return cls(record["name"], record["trained_with"], record["local_only"])
        except (OSError, json.JSONDecodeError, KeyError, TypeError) as err:
            raise DrafterError(
                f"{path}: cannot read the drafter's target ({err}): export the drafter again"
            ) from None


def write_serving_readme(
    path: Path, drafter_config: DrafterConfigJson, target: TargetReference, *, num_steps: int
) -> None:
    """The README beside the checkpoint: how to carry it to a serving node and serve it with its target
    (vLLM, SGLang), by the target's name, never by a path of the training node."""
    layers = drafter_config["eagle_config"]["eagle_aux_hidden_state_layer_ids"]
    vllm_layers = drafter_config["eagle_aux_hidden_state_layer_ids"]
    speculative = (
        f'{{\\"method\\": \\"eagle3\\", \\"model\\": \\"$DRAFTER\\", '
        f'\\"num_speculative_tokens\\": {num_steps}}}'
    )
    if target.local_only:
        where = (
            f"`{target.name}` was built on the training node ({target.path}): the engines need those\n"
            "very files, not a hub's, so copy that folder to the serving node too and set TARGET to its path."
        )
        name = "/path/on/this/node/to/the/target"
    else:
        where = (
            f"The engines resolve `{target.name}` as usual (the Hugging Face hub, or this node's cache of\n"
            "it with HF_HUB_OFFLINE=1); to serve a local copy instead, set TARGET to its path."
        )
        name = target.name
    text = f"""# EAGLE-3 drafter for `{target.name}`

`config.json` and `model.safetensors` ({ARCHITECTURE}; the server takes the embedding from the target).
Aux layers: outputs of target layers {layers}, written as `eagle_config.eagle_aux_hidden_state_layer_ids`
{layers} (SGLang, SpecForge) and top-level `eagle_aux_hidden_state_layer_ids` {vllm_layers} (vLLM's
input-of-layer ids). `eval.json` beside this file has the acceptance measured with {num_steps} draft
tokens per step; `target.json` names the target it was trained against.

To serve it elsewhere, copy this folder (`config.json` and `model.safetensors` are all the engines read)
to the serving node. {where}

```
DRAFTER=/path/on/this/node/to/this/folder
TARGET={name}
```

vLLM:
```
vllm serve "$TARGET" --speculative-config "{speculative}"
```

SGLang:
```
python -m sglang.launch_server --model-path "$TARGET" --speculative-algorithm EAGLE3 \\
  --speculative-draft-model-path "$DRAFTER" --speculative-num-steps {num_steps} \\
  --speculative-eagle-topk 1 --speculative-num-draft-tokens {num_steps + 1}
```
"""
    atomic_write(path, lambda tmp: tmp.write_text(text))


def load_exported(drafter_dir: Path, target_dir: Path, *, dtype: str = "float32") -> Eagle3Drafter:
    """The drafter as SGLang builds it from the files: fused layout, embedding from the target."""
    drafter_dir = Path(drafter_dir)
    config = _config_from_json(drafter_dir / "config.json")
    embed, _ = load_target_embeddings(target_dir)
    drafter = Eagle3Drafter(config, embed)
    drafter.midlayer.self_attn = FusedAttention(config)
    drafter.midlayer.mlp = FusedMLP(config)
    drafter.to(getattr(torch, dtype))
    params = {name: p for name, p in drafter.named_parameters() if name not in NOT_EXPORTED}
    loaded: dict[str, set[Any]] = {name: set() for name in params}
    d2t: Tensor | None = None
    weights = drafter_dir / "model.safetensors"
    with safe_open(str(weights), framework="pt") as tensors:
        names = tensors.keys()  # a safetensors handle is not iterable
        for name in names:
            tensor = tensors.get_tensor(name)
            if name == "d2t":
                d2t = tensor
            elif name != "t2d":  # SGLang ignores t2d; it is rebuilt from d2t below
                _load_weight(drafter, params, loaded, weights, name, tensor)
    incomplete = [name for name, shards in loaded.items() if shards != _expected_shards(name)]
    if incomplete or d2t is None:
        raise DrafterError(
            f"{weights}: missing weights {incomplete + ([] if d2t is not None else ['d2t'])}: "
            "re-export the drafter"
        )
    hot_token_id = d2t + torch.arange(config.draft_vocab_size)
    t2d = torch.zeros(config.vocab_size, dtype=torch.bool)
    t2d[hot_token_id] = True
    drafter.set_draft_vocab(d2t, t2d)
    return drafter.eval()


class FusedAttention(nn.Module):
    def __init__(self, config: Eagle3Config) -> None:
        super().__init__()
        q_size = config.num_attention_heads * config.head_dim
        kv_size = config.num_key_value_heads * config.head_dim
        self.head_dim = config.head_dim
        self.sizes = [q_size, kv_size, kv_size]
        self.shard_rows: dict[str | int, slice] = {
            "q": slice(0, q_size),
            "k": slice(q_size, q_size + kv_size),
            "v": slice(q_size + kv_size, q_size + 2 * kv_size),
        }
        self.qkv_proj = nn.Linear(2 * config.hidden_size, q_size + 2 * kv_size, bias=False)
        self.o_proj = nn.Linear(q_size, config.hidden_size, bias=False)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, packed: PackedRows, context_step: bool) -> Tensor:
        q, k, v = self.qkv_proj(x).split(self.sizes, dim=-1)
        return self.o_proj(self_attention(q, k, v, cos, sin, packed, context_step, self.head_dim))


class FusedMLP(nn.Module):
    def __init__(self, config: Eagle3Config) -> None:
        super().__init__()
        size = config.intermediate_size
        self.shard_rows: dict[str | int, slice] = {0: slice(0, size), 1: slice(size, 2 * size)}
        self.gate_up_proj = nn.Linear(config.hidden_size, 2 * size, bias=False)
        self.down_proj = nn.Linear(size, config.hidden_size, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        return self.down_proj(nn.functional.silu(gate) * up)


def _load_weight(
    drafter: Eagle3Drafter,
    params: dict[str, nn.Parameter],
    loaded: dict[str, set[Any]],
    weights: Path,
    name: str,
    tensor: Tensor,
) -> None:
    """Copy one checkpoint tensor into its (possibly fused) parameter, the way SGLang's loader does."""
    for fused, piece, shard in STACKED_PARAMS:
        if f".{piece}." in name:
            target = name.replace(f".{piece}.", f".{fused}.")
            module = drafter.get_submodule(target.rsplit(".", 2)[0])
            if not isinstance(module, FusedAttention | FusedMLP):
                raise DrafterError(f"{weights}: unexpected tensor {name}: the drafter is not fused")
            rows = module.shard_rows[shard]
            break
    else:
        target, shard, rows = name, None, slice(None)
    param = params.get(target)
    if param is None or shard in loaded[target] or param.data[rows].shape != tensor.shape:
        raise DrafterError(f"{weights}: unexpected tensor {name} {tuple(tensor.shape)}: re-export it")
    param.data[rows].copy_(tensor)
    loaded[target].add(shard)


def _expected_shards(param_name: str) -> set[Any]:
    shards = {shard for fused, _, shard in STACKED_PARAMS if f".{fused}." in param_name}
    return shards or {None}


def _config_from_json(path: Path) -> Eagle3Config:
    try:
        raw = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise DrafterError(f"{path}: cannot read the drafter config ({err}): export a drafter") from None
    if raw.get("architectures") != [ARCHITECTURE] or raw.get("num_hidden_layers") != 1:
        raise DrafterError(f"{path}: not a one-layer {ARCHITECTURE} config: export it with eaglepipe")
    try:
        readings = aux_layers_as_read(raw)
    except (KeyError, TypeError, IndexError):
        raise DrafterError(
            f"{path}: lacks eagle_config.eagle_aux_hidden_state_layer_ids: re-export it"
        ) from None
    if len({str(layers) for layers in readings.values()}) != 1:
        raise DrafterError(f"{path}: engines would read different aux layers {readings}: re-export it")
    try:
        return Eagle3Config(
            **{
                key: raw[key]
                for key in (
                    "hidden_size",
                    "intermediate_size",
                    "num_attention_heads",
                    "num_key_value_heads",
                    "head_dim",
                    "rms_norm_eps",
                    "rope_theta",
                    "max_position_embeddings",
                    "vocab_size",
                    "draft_vocab_size",
                    "target_hidden_size",
                    "torch_dtype",
                )
            },
            aux_layer_ids=tuple(raw["eagle_config"]["eagle_aux_hidden_state_layer_ids"]),
        )
    except KeyError as err:
        raise DrafterError(f"{path}: lacks key {err}: re-export the drafter") from None
