"""The `vllm` hidden-state backend, for real: vLLM's CPU build (`make vllm-env`) extracts the embedded
model's states through its own `extract_hidden_states` method and our connector, and they agree with the
`hf` backend's on the same ids."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from test_hidden import ROWS, extract, write_tokens

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[1]
VLLM_PYTHON = REPO / ".venv-vllm" / "bin" / "python"


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got - want).norm() / want.norm())


def test_vllm_states_agree_with_the_hf_backend(tmp_path, model_dir):
    """The backend starts its own engine (vLLM's `extract_hidden_states` with our connector): that start is
    part of what is checked, so it shares none."""
    if not VLLM_PYTHON.is_file():
        pytest.fail(f"{VLLM_PYTHON} is missing: run `make vllm-env`, or deselect with -m 'not vllm'")
    rows = [*ROWS, ROWS[0][:4] + [9226, 17, 2]]  # a shared prefix: vLLM's prefix cache serves part of it
    token_path = write_tokens(tmp_path, rows)
    hf = extract(token_path, model_dir, tmp_path / "hf", shard_tokens=12)
    vllm = extract(token_path, model_dir, tmp_path / "vllm", shard_tokens=12, backend="vllm",
                   engine_python=str(VLLM_PYTHON))
    assert vllm["backend"] == "vllm" and "before the final norm" in vllm["stored"]["final"]
    assert [s["num_tokens"] for s in vllm["shards"]] == [s["num_tokens"] for s in hf["shards"]]
    errors = {}
    for ours, theirs in zip(hf["shards"], vllm["shards"], strict=True):
        want = load_file(str(tmp_path / "hf" / ours["path"]))
        got = load_file(str(tmp_path / "vllm" / theirs["path"]))
        assert torch.equal(got["input_ids"], want["input_ids"])  # the ids vLLM prefilled were checked
        for name in ("aux", "final"):
            errors[(ours["path"], name)] = relative_error(got[name], want[name])
            # Element-wise: fp32 sums in another order (vLLM's fused kernels) move the largest activations
            # (hundreds) by a few 1e-4.
            torch.testing.assert_close(got[name], want[name], rtol=1e-3, atol=1e-3)
    report = {f"{path}:{name}": f"{error:.1e}" for (path, name), error in errors.items()}
    print("vLLM vs hf, relative error (fp32):", report)
    assert max(errors.values()) < 1e-5
