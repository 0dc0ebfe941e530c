"""How the target's layers are numbered where EAGLE-3 reads them: by us, by vLLM and by SGLang.

The same three tensors go by different numbers. Ours (the manifests', `eagle_config`'s, SpecForge's) is
"output of layer i" = HF `hidden_states[i + 1]`. vLLM reads a draft config's top-level ids, and its capture
ids, as "input of layer k" (k = i + 1). SGLang's Llama family always adds 1 to the ids it is given; its
DeepSeek-V3 family (Kimi-K2.5) adds 1 only when the first id is 1. Every stage that hands layer ids to an
engine, or to a served draft, goes through this module, so the stored states and the served drafter are
the same tensors. Torch-free: the spend plan and the config check import it at parse time.
"""

from __future__ import annotations

from typing import TypedDict

from eaglepipe.errors import EaglepipeError


class AuxLayerError(EaglepipeError, ValueError):
    """Aux-layer ids some engine would read as other layers, or outside the target: one line."""


class EagleConfig(TypedDict):
    eagle_aux_hidden_state_layer_ids: list[int]  # ours
    use_aux_hidden_state: bool


class ServedLayerKeys(TypedDict):
    """A draft config's layer keys (`served_config_keys`)."""

    eagle_aux_hidden_state_layer_ids: list[int]  # vLLM's: ours + 1
    eagle_config: EagleConfig


def default_aux_layers(num_layers: int) -> list[int]:
    """EAGLE-3's low, middle and high layer: [1, N//2 - 1, N - 4] (Kimi-K2.5, N = 61: [1, 29, 57])."""
    return [1, num_layers // 2 - 1, num_layers - 4]


def served_config_keys(aux_layer_ids: list[int] | tuple[int, ...]) -> ServedLayerKeys:
    """A draft config's layer keys: ours in `eagle_config` (SGLang, SpecForge), +1 at top level (vLLM)."""
    return {
        "eagle_aux_hidden_state_layer_ids": [i + 1 for i in aux_layer_ids],
        "eagle_config": {
            "eagle_aux_hidden_state_layer_ids": list(aux_layer_ids),
            "use_aux_hidden_state": True,
        },
    }


def aux_layers_as_read(config: ServedLayerKeys) -> dict[str, list[int]]:
    """The target layers (our ids) whose outputs each engine feeds the draft whose config is `config`."""
    nested = list(config["eagle_config"]["eagle_aux_hidden_state_layer_ids"])
    top_level = list(config.get("eagle_aux_hidden_state_layer_ids", nested))
    return {
        "vLLM": [i - 1 for i in top_level],
        "SGLang (Llama family)": nested,
        "SGLang (DeepSeek-V3/Kimi family)": nested if nested[0] == 1 else [i - 1 for i in nested],
    }


def check_engines_agree(aux_layer_ids: list[int] | tuple[int, ...]) -> None:
    """Refuse aux layers that some engine would silently read as other layers."""
    readings = aux_layers_as_read(served_config_keys(aux_layer_ids))
    for engine, layers in readings.items():
        if layers != list(aux_layer_ids):
            raise AuxLayerError(
                f"aux layers {list(aux_layer_ids)}: {engine} would feed the drafter layers {layers} "
                "(its DeepSeek-V3/Kimi family adds 1 to the ids only when the first is 1): "
                "choose aux layers starting at layer 1, as the default [1, N//2-1, N-4] does"
            )


def check_aux_layers(aux_layer_ids: list[int], num_layers: int) -> None:
    """Inside the target, and read alike by every engine; the message names the config key."""
    if any(not 0 <= layer < num_layers for layer in aux_layer_ids):
        raise AuxLayerError(
            f"config key 'hidden.aux_layers' = {aux_layer_ids}: the target has layers 0..{num_layers - 1}"
        )
    try:
        check_engines_agree(aux_layer_ids)
    except AuxLayerError as err:
        raise AuxLayerError(f"config key 'hidden.aux_layers': {err}") from None


def vllm_capture_ids(aux_layer_ids: list[int], num_layers: int) -> list[int]:
    """vLLM's `extract_hidden_states` ids: each aux layer's input-of-layer id, then `num_layers`, which
    vLLM reads as the last layer's output before the final norm."""
    return [i + 1 for i in aux_layer_ids] + [num_layers]


def sglang_capture_ids(aux_layer_ids: list[int]) -> list[int]:
    """What to pass to SGLang's `set_eagle3_layers_to_capture`. Both families turn ids starting at 1 (the
    only ones `check_aux_layers` accepts) into the same input-of-layer ids, so ours pass unchanged."""
    check_engines_agree(aux_layer_ids)
    return list(aux_layer_ids)
