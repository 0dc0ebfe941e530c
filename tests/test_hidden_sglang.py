"""The `sglang` hidden-state backend without a GPU: against the real SGLang package (`make sglang-env`), its
reading of a Kimi-K2.5-shaped config, the capture ids SGLang's own code derives from ours, and the SGLang
signatures the worker calls; in the project's environment, the checks made before any engine starts.
The GPU run itself is tests/gpu/test_sglang_backend.py."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from kimi_k25_config import KIMI_K25
from stage_settings import hidden_settings

from eaglepipe.drafter.export import config_json
from eaglepipe.drafter.model import Eagle3Config
from eaglepipe.hidden import HiddenError
from eaglepipe.hidden.backends import memory_problem
from eaglepipe.hidden.backends.sglang import SGLangBackend
from eaglepipe.target.architecture import TargetArchitecture
from eaglepipe.target.layer_ids import vllm_capture_ids

REPO = Path(__file__).resolve().parents[1]
SGLANG_PYTHON = REPO / ".venv-sglang" / "bin" / "python"
KIMI_SHAPE = KIMI_K25


@pytest.fixture(scope="module")
def sglang_facts(tmp_path_factory) -> dict:
    if not SGLANG_PYTHON.is_file():
        pytest.fail(f"{SGLANG_PYTHON} is missing: run `make sglang-env`, or deselect with -m 'not sglang'")
    work = tmp_path_factory.mktemp("sglang")
    (work / "kimi").mkdir()
    (work / "kimi" / "config.json").write_text(json.dumps(KIMI_SHAPE))
    kimi = TargetArchitecture.from_config(KIMI_SHAPE)
    drafter = Eagle3Config.from_target(kimi, 32000, [1, 29, 57], "bfloat16")
    (work / "drafter").mkdir()
    (work / "drafter" / "config.json").write_text(json.dumps(config_json(drafter)))
    env = {**os.environ, "PYTHONPATH": f"{REPO / 'tests' / 'sglang_cpu'}{os.pathsep}{REPO}"}
    result = subprocess.run(
        [
            str(SGLANG_PYTHON),
            str(REPO / "tests" / "sglang_checks.py"),
            str(work / "kimi"),
            str(work / "facts.json"),
            "--drafter",
            str(work / "drafter"),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads((work / "facts.json").read_text())


@pytest.mark.sglang
@pytest.mark.slow
def test_sglang_reads_the_kimi_shaped_config_as_we_do(sglang_facts):
    assert sglang_facts["version"] == "0.5.14" and sglang_facts["version_problem"] is None
    assert sglang_facts["model_config"] == {
        "architecture": "KimiK25ForConditionalGeneration",
        "num_hidden_layers": 61,
        "hidden_size": 7168,
        "text_model_type": "kimi_k2",  # as the checkpoint spells it; SGLang builds DeepSeek-V3 from it
    }
    ours = TargetArchitecture.from_config(KIMI_SHAPE)
    assert (ours.num_layers, ours.hidden_size) == (61, 7168)
    assert sglang_facts["server_args"] == {
        "tp_size": 8,
        "context_length": 20001,
        "disable_radix_cache": True,
        "chunked_prefill_size": -1,
        "disable_cuda_graph": True,
        "enable_return_hidden_states": True,
        "skip_tokenizer_init": True,
        "mem_fraction_static": 0.85,
    }


@pytest.mark.sglang
@pytest.mark.slow
def test_sglang_captures_the_layers_the_drafter_is_trained_on(sglang_facts):
    """SGLang's own set_eagle3_layers_to_capture, on Kimi-K2.5's class: the same input-of-layer ids vLLM
    is given for our output-of-layer ids; a first id other than 1 would silently shift in DeepSeek-V3."""
    capture = sglang_facts["capture"]
    assert capture["ours"] == [1, 29, 57]
    assert (
        capture["kimi_k25"] == capture["deepseek_v3"] == vllm_capture_ids([1, 29, 57], 61)[:3] == [2, 30, 58]
    )
    assert capture["llama"] == vllm_capture_ids([1, 14, 26], 30)[:3]
    assert capture["deepseek_v3_first_id_2"] == [2, 29, 57]  # why check_aux_layers refuses such lists


@pytest.mark.sglang
@pytest.mark.slow
def test_sglang_reads_the_exported_kimi_drafter_as_the_trained_layers(sglang_facts):
    """The exported config.json, loaded by SGLang's ModelConfig as its EAGLE-3 worker loads a draft: the
    ids it hands the target, and the layers Kimi-K2.5's and DeepSeek-V3's own classes then capture."""
    drafter = sglang_facts["drafter"]
    assert drafter["architecture"] == "LlamaForCausalLMEagle3"
    assert drafter["geometry"] == {
        "hidden_size": 7168, "num_attention_heads": 64, "num_key_value_heads": 64, "head_dim": 128,
        "intermediate_size": 18432, "vocab_size": 163840, "draft_vocab_size": 32000,
        "target_hidden_size": 7168,
    }
    assert drafter["layer_ids_read"] == [1, 29, 57]
    # Input-of-layer ids: the outputs of layers 1, 29, 57, which the drafter was trained on.
    assert drafter["kimi_k25_captures"] == drafter["deepseek_v3_captures"] == [2, 30, 58]


@pytest.mark.sglang
@pytest.mark.slow
def test_the_worker_calls_sglang_with_its_real_signatures(sglang_facts):
    signatures = sglang_facts["signatures"]
    # LogitsInputs unpacks the logits step's positional inputs in this order.
    assert signatures["LogitsProcessor.forward"][:6] == [
        "self",
        "input_ids",
        "hidden_states",
        "lm_head",
        "logits_metadata",
        "aux_hidden_states",
    ]
    passed = {
        "model_config",
        "mem_fraction_static",
        "gpu_id",
        "tp_rank",
        "tp_size",
        "moe_ep_rank",
        "moe_ep_size",
        "pp_rank",
        "pp_size",
        "nccl_port",
        "server_args",
    }
    assert passed <= set(signatures["ModelRunner.__init__"])
    assert signatures["ModelRunner.methods"] == ["alloc_memory_pool", "init_attention_backends", "forward"]
    assert signatures["Req.__init__"][:5] == [
        "self",
        "rid",
        "origin_input_text",
        "origin_input_ids",
        "sampling_params",
    ]
    assert signatures["ScheduleBatch.init_new"][:7] == [
        "reqs",
        "req_to_token_pool",
        "token_to_kv_pool_allocator",
        "tree_cache",
        "model_config",
        "enable_overlap",
        "spec_algorithm",
    ]
    assert signatures["CacheInitParams"][:4] == [
        "disable",
        "req_to_token_pool",
        "token_to_kv_pool_allocator",
        "page_size",
    ]
    assert signatures["ForwardBatch.init_new"] == ["batch", "model_runner"]


def test_the_sglang_backend_refuses_to_start_without_gpus(model_dir):
    target = TargetArchitecture.from_dir(model_dir)
    with pytest.raises(HiddenError, match="hidden.backend' = sglang needs GPUs"):
        SGLangBackend(hidden_settings(backend="sglang", gpus=0).backend, model_dir, [1, 14, 26], target, 100)


def test_a_target_too_large_for_the_gpus_is_refused_in_one_line(tmp_path):
    (tmp_path / "model-00001.safetensors").write_bytes(b"\0" * 1000)
    assert memory_problem(tmp_path, 2, 0.5, 2000) is None  # 1000 B of weights, 2000 B usable
    problem = memory_problem(tmp_path, 1, 0.5, 2000)
    assert problem and "raise hidden.gpus" in problem and "\n" not in problem
