"""On a GPU node with SGLang installed (`pip install -c constraints-gpu.txt -e '.[gpu]'`): the sglang backend
on the embedded model agrees with the hf backend. Skipped, with the reason, everywhere else."""

from __future__ import annotations

import importlib.util

import pytest
import torch
from test_hidden import ROWS, extract, write_tokens

pytestmark = [pytest.mark.gpu, pytest.mark.slow]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: SGLang has no CPU build")
@pytest.mark.skipif(importlib.util.find_spec("sglang") is None, reason="needs SGLang: pip install '.[gpu]'")
def test_sglang_states_agree_with_the_hf_backend(tmp_path, model_dir):
    token_path = write_tokens(tmp_path, ROWS)
    hf = extract(token_path, model_dir, tmp_path / "hf", dtype="bfloat16")
    sglang = extract(token_path, model_dir, tmp_path / "sglang", dtype="bfloat16", backend="sglang", gpus=1)
    from safetensors.torch import load_file

    want = load_file(str(tmp_path / "hf" / hf["shards"][0]["path"]))
    got = load_file(str(tmp_path / "sglang" / sglang["shards"][0]["path"]))
    for name in ("aux", "final"):
        error = float((got[name].float() - want[name].float()).norm() / want[name].float().norm())
        print(f"sglang vs hf ({name}, bf16): relative error {error:.1e}")
        assert error < 2e-2
