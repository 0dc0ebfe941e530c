"""The vLLM side of the `vllm` hidden-state backend: one engine for the whole job, fed samples on request.

Runs under the interpreter of the environment vLLM is installed in (`hidden.engine_python`; the project's
own environment has no vLLM, whose pins differ). It reads one JSON request per line on stdin
({"samples": file, "out": file}), prefills each sample through vLLM's `extract_hidden_states` method (one
generated token, discarded), and answers on the reply descriptor with {"out": file} or {"error": line}.
The answer file holds `hidden_states` [T, L, H] (the capture ids in ascending order) and `token_ids` [T]:
exactly what vLLM prefilled, for the driver's agreement check. Imports only vLLM, torch and the standard
library (and the protocol's small reply helper), so vLLM's spawned workers can import it.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import NotRequired, TypedDict

from eaglepipe.hidden.backends import gpu_memory_problem
from eaglepipe.hidden.backends.engine_process import WorkerReplies

VLLM_VERSION = "0.32"  # the connector relies on this version's private methods (constraints-vllm.txt)
CONNECTOR_MODULE = "eaglepipe.hidden.backends.vllm_connector"


class DraftHFConfig(TypedDict):
    eagle_aux_hidden_state_layer_ids: list[int]


class DraftModelConfig(TypedDict):
    hf_config: DraftHFConfig


class SpeculativeConfig(TypedDict):
    method: str
    num_speculative_tokens: int
    draft_model_config: DraftModelConfig


class ConnectorStorage(TypedDict):
    shared_storage_path: str


class KVTransferConfig(TypedDict):
    kv_connector: str
    kv_connector_module_path: str
    kv_role: str
    kv_connector_extra_config: ConnectorStorage


class EngineArguments(TypedDict):
    """The `vllm.LLM` keywords this worker sets (`engine_arguments`): the hidden states leave through our
    connector, as the speculative `extract_hidden_states` method's KV transfer."""

    model: str
    dtype: str
    tensor_parallel_size: int
    max_model_len: int
    seed: int
    enforce_eager: bool
    skip_tokenizer_init: bool
    speculative_config: SpeculativeConfig
    kv_transfer_config: KVTransferConfig
    language_model_only: NotRequired[bool]
    attention_backend: NotRequired[str]
    gpu_memory_utilization: NotRequired[float]


def engine_arguments(args: argparse.Namespace) -> EngineArguments:
    on_cpu = args.device == "cpu"
    engine: EngineArguments = {
        "model": args.target,
        "dtype": args.dtype,
        "tensor_parallel_size": args.tensor_parallel,
        "max_model_len": args.max_model_len,
        "seed": 0,
        "enforce_eager": on_cpu,
        # Samples arrive as token ids: the target's tokenizer (Kimi's needs remote code) is never loaded.
        "skip_tokenizer_init": True,
        "speculative_config": {
            "method": "extract_hidden_states",
            "num_speculative_tokens": 1,
            "draft_model_config": {"hf_config": {"eagle_aux_hidden_state_layer_ids": args.capture_ids}},
        },
        "kv_transfer_config": {
            "kv_connector": "CPUHiddenStatesConnector",
            "kv_connector_module_path": CONNECTOR_MODULE,
            "kv_role": "kv_producer",
            "kv_connector_extra_config": {"shared_storage_path": args.storage},
        },
    }
    if args.language_model_only:  # Kimi-K2.5: neither build nor load the vision tower for a text job
        engine["language_model_only"] = True
    if on_cpu and args.mla and args.dtype == "float32":
        # vLLM picks its AMX MLA kernels wherever the CPU has AMX, and they take bf16 weights only.
        engine["attention_backend"] = "CPU_MLA"
    if not on_cpu:
        engine["gpu_memory_utilization"] = args.memory_fraction
    return engine


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--target", required=True)
    parser.add_argument("--capture-ids", required=True, type=json.loads, help="JSON list, ascending")
    parser.add_argument("--dtype", required=True)
    parser.add_argument("--device", choices=["cpu", "cuda"], required=True)
    parser.add_argument("--tensor-parallel", type=int, default=1)
    parser.add_argument("--max-model-len", type=int, required=True)
    parser.add_argument("--memory-fraction", type=float, default=0.85)
    parser.add_argument("--storage", required=True, help="where vLLM writes per-request files")
    parser.add_argument("--language-model-only", action="store_true", help="a multimodal target, text only")
    parser.add_argument("--mla", action="store_true", help="the target's attention is MLA (DeepSeek, Kimi)")
    parser.add_argument("--reply-fd", type=int, required=True)
    args = parser.parse_args()
    replies = WorkerReplies(args.reply_fd)

    import vllm

    if not vllm.__version__.startswith(VLLM_VERSION + "."):
        replies.error(
            f"vLLM {vllm.__version__} is installed, the vllm backend needs {VLLM_VERSION}.x: "
            "install the version in constraints-vllm.txt (make vllm-env)"
        )
        return
    if args.device == "cpu":
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")  # GiB; vLLM's default takes far more
    import torch
    from safetensors.torch import load_file, save_file
    from vllm import LLM, SamplingParams
    from vllm.distributed.kv_transfer.kv_connector.v1.example_hidden_states_connector import (
        cleanup_hidden_states,
        load_hidden_states,
    )
    from vllm.inputs import TokensPrompt

    if args.device == "cuda":
        problem = gpu_memory_problem(args.target, args.tensor_parallel, args.memory_fraction)
        if problem:
            replies.error(problem)
            return
    llm = LLM(**engine_arguments(args))
    one_token = SamplingParams(max_tokens=1, temperature=0.0)
    replies.ready()
    for samples_path, out_path in replies.requests():
        samples = load_file(samples_path)
        offsets = samples["offsets"].tolist()
        ids = samples["input_ids"].tolist()
        prompts = [
            TokensPrompt(prompt_token_ids=ids[a:b]) for a, b in zip(offsets, offsets[1:], strict=False)
        ]
        states, token_ids = [], []
        for output in llm.generate(prompts, one_token, use_tqdm=False):
            path = (output.kv_transfer_params or {}).get("hidden_states_path")
            if path is None:
                replies.error(f"vLLM wrote no hidden states for request {output.request_id}")
                return
            saved = load_hidden_states(path)
            states.append(saved["hidden_states"])
            token_ids.append(saved["token_ids"].to(torch.int64))
            cleanup_hidden_states(path)
        save_file({"hidden_states": torch.cat(states), "token_ids": torch.cat(token_ids)}, out_path)
        Path(samples_path).unlink()
        replies.done(out_path)


if __name__ == "__main__":  # vLLM spawns worker processes that import this module
    main()
