"""Loading the target's tokenizer and language model for the CPU/GPU stages."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict

from eaglepipe.target.architecture import TargetArchitecture
from eaglepipe.target.hf_tokenizer import HFTokenizer
from eaglepipe.target.kimi_tokenizer import KimiTokenizer
from eaglepipe.target.tokenizer import TargetTokenizer, has_kimi_tokenizer

if TYPE_CHECKING:  # torch and transformers are imported where a model is loaded
    import torch
    from transformers import PretrainedConfig


class LoadKeywords(TypedDict, total=False):
    """The `from_pretrained` keywords `load_target` sets."""

    dtype: torch.dtype
    config: PretrainedConfig
    key_mapping: dict[str, str]
    device_map: str


# A nested text config's model type as the checkpoint spells it -> transformers' class for it.
TEXT_MODEL_TYPES = {"kimi_k2": "deepseek_v3"}


def flush_denormals() -> None:
    """Denormal activations make CPU float32 math several times slower (measured: a batched decode step
    of SmolLM2 took 1.3 s with them, 0.17 s without); values below 1.2e-38 do not change a greedy token
    (checked on the demo prompts: identical outputs)."""
    import torch

    torch.set_flush_denormal(True)


def load_tokenizer(model_dir: str | Path) -> Any:
    """The directory's Hugging Face tokenizer (targets without Kimi's `tiktoken.model`)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(model_dir))


def load_target_tokenizer(target_dir: str | Path) -> TargetTokenizer:
    """Kimi's native tokenizer when the directory holds `tiktoken.model`, else the directory's HF tokenizer
    (transformers is imported only then: a Kimi stage never needs it)."""
    if has_kimi_tokenizer(target_dir):
        return KimiTokenizer.from_dir(target_dir)
    return HFTokenizer(load_tokenizer(target_dir))


def load_target(model_dir: str | Path, dtype: str = "float32", device: str = "cpu") -> Any:
    """The target's causal LM in eval mode. A nested target (Kimi-K2.5) loads its language model alone,
    from the `language_model.` tensors, without building its vision tower. `device="auto"` spreads a large
    target over all GPUs."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    flush_denormals()
    kwargs: LoadKeywords = {"dtype": getattr(torch, dtype)}
    target = TargetArchitecture.from_dir(model_dir)
    if target.nested:
        text = dict(target.text)
        model_type = TEXT_MODEL_TYPES.get(target.text_model_type, target.text_model_type)
        text.pop("model_type", None)
        kwargs["config"] = AutoConfig.for_model(model_type, **text)
        kwargs["key_mapping"] = {f"^{target.weight_prefix.replace('.', '[.]')}": ""}
    if device == "auto":
        kwargs["device_map"] = "auto"
    # Typed as the Module it is: transformers wraps its `to` in functools.wraps, whose types cannot bind it.
    model: torch.nn.Module = AutoModelForCausalLM.from_pretrained(str(model_dir), **kwargs)
    if device != "auto":
        model.to(device)
    model.eval()
    return model
