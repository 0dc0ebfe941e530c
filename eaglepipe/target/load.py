"""Loading the target model and tokenizer for the CPU/GPU stages."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def load_tokenizer(model_dir: str | Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(model_dir))


def load_target(model_dir: str | Path, dtype: str = "float32", device: str = "cpu") -> tuple[Any, Any]:
    """(model in eval mode, tokenizer). `device="auto"` spreads a large target over all GPUs."""
    import torch
    from transformers import AutoModelForCausalLM

    kwargs: dict[str, Any] = {"dtype": getattr(torch, dtype)}
    if device == "auto":
        kwargs["device_map"] = "auto"
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), **kwargs)
    if device != "auto":
        model.to(device)
    model.eval()
    return model, load_tokenizer(model_dir)
