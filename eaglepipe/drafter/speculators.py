"""The exported drafter rewritten in vLLM speculators' own Eagle3 format (`drafter/speculators/`).

vLLM detects that format natively: a config.json without `model_type` but with `speculators_model_type` and a
`speculators_config` naming the verifier (by the target's name: see `TargetReference`). The weights are the
same tensors (`midlayer.` becomes `layers.0.`). `norm_before_residual` is written explicitly: our layer
takes the residual before `hidden_norm`, and vLLM assumes the other order when the key is absent, which is
a different model with no error.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TypedDict

from safetensors import safe_open
from safetensors.torch import save_file

from eaglepipe.drafter import DrafterError
from eaglepipe.drafter.export import ARCHITECTURE, DrafterConfigJson, TargetReference, TransformerLayerConfig
from eaglepipe.io import atomic_write, write_json

SPECULATORS_VERSION = "0.9.0"  # the speculators release the format was checked against (tests)


class ProposalMethod(TypedDict):
    proposal_type: str
    speculative_tokens: int
    verifier_accept_k: int
    accept_tolerance: float


class Verifier(TypedDict):
    name_or_path: str
    architectures: list[str]


class SpeculatorsSection(TypedDict):
    algorithm: str
    proposal_methods: list[ProposalMethod]
    default_proposal_method: str
    verifier: Verifier


class SpeculatorsConfig(TypedDict):
    """config.json of the speculators format."""

    architectures: list[str]
    speculators_model_type: str
    speculators_version: str
    speculators_config: SpeculatorsSection
    transformer_layer_config: TransformerLayerConfig
    draft_vocab_size: int
    norm_before_residual: bool
    target_hidden_size: int
    eagle_aux_hidden_state_layer_ids: list[int]
    torch_dtype: str


def speculators_config(
    exported: DrafterConfigJson,
    *,
    verifier: str,
    verifier_architectures: list[str],
    num_speculative_tokens: int,
) -> SpeculatorsConfig:
    """config.json of the speculators format, from our exported config.json."""
    layer: TransformerLayerConfig = {
        "model_type": "llama",
        "num_hidden_layers": 1,
        "hidden_size": exported["hidden_size"],
        "intermediate_size": exported["intermediate_size"],
        "num_attention_heads": exported["num_attention_heads"],
        "num_key_value_heads": exported["num_key_value_heads"],
        "head_dim": exported["head_dim"],
        "rms_norm_eps": exported["rms_norm_eps"],
        "rope_theta": exported["rope_theta"],
        "rope_scaling": exported["rope_scaling"],
        "max_position_embeddings": exported["max_position_embeddings"],
        "vocab_size": exported["vocab_size"],
        "hidden_act": exported["hidden_act"],
        "tie_word_embeddings": exported["tie_word_embeddings"],
    }
    return {
        "architectures": ["Eagle3Speculator"],
        "speculators_model_type": "eagle3",
        "speculators_version": SPECULATORS_VERSION,
        "speculators_config": {
            "algorithm": "eagle3",
            "proposal_methods": [
                {
                    "proposal_type": "greedy",
                    "speculative_tokens": num_speculative_tokens,
                    "verifier_accept_k": 1,
                    "accept_tolerance": 0.0,
                }
            ],
            "default_proposal_method": "greedy",
            "verifier": {"name_or_path": verifier, "architectures": verifier_architectures},
        },
        "transformer_layer_config": layer,
        "draft_vocab_size": exported["draft_vocab_size"],
        "norm_before_residual": False,
        "target_hidden_size": exported["target_hidden_size"],
        # vLLM's input-of-layer ids, which speculators stores and vLLM uses as given.
        "eagle_aux_hidden_state_layer_ids": exported["eagle_aux_hidden_state_layer_ids"],
        "torch_dtype": exported["torch_dtype"],
    }


def export_speculators(
    drafter_dir: Path,
    out_dir: Path,
    *,
    target: TargetReference,
    verifier_architectures: list[str],
    num_speculative_tokens: int,
) -> None:
    """Write `out_dir/config.json` and `model.safetensors` from the drafter exported in `drafter_dir`. The
    verifier is the target's name: vLLM serves this folder alone (`vllm serve DIR` takes the verifier from
    the config), so a training node's path there would break it anywhere else."""
    drafter_dir, out_dir = Path(drafter_dir), Path(out_dir)
    try:
        exported = json.loads((drafter_dir / "config.json").read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise DrafterError(
            f"{drafter_dir / 'config.json'}: cannot read it ({err}): export the drafter first"
        ) from None
    if exported.get("architectures") != [ARCHITECTURE]:
        raise DrafterError(
            f"{drafter_dir / 'config.json'}: not an {ARCHITECTURE} drafter: export it with eaglepipe"
        )
    weights = drafter_dir / "model.safetensors"
    if not weights.is_file():
        raise DrafterError(f"{weights}: missing: export the drafter first")
    with safe_open(str(weights), framework="pt") as tensors:
        names = tensors.keys()  # a safetensors handle is not iterable
        renamed = {name.replace("midlayer.", "layers.0.", 1): tensors.get_tensor(name) for name in names}
    config = speculators_config(
        exported,
        verifier=target.name,
        verifier_architectures=verifier_architectures,
        num_speculative_tokens=num_speculative_tokens,
    )
    out_dir.mkdir(parents=True, exist_ok=True)
    atomic_write(
        out_dir / "model.safetensors", lambda tmp: save_file(renamed, str(tmp), metadata={"format": "pt"})
    )
    write_json(out_dir / "config.json", config)
