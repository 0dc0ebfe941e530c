"""What of the `sglang` hidden-state backend runs without a GPU, run against the real SGLang package.

Run with the SGLang test environment's interpreter (`make sglang-env`; tests/test_hidden_sglang.py does):
`.venv-sglang/bin/python tests/sglang_checks.py TARGET_DIR OUT.json`, with tests/sglang_cpu on PYTHONPATH.
TARGET_DIR holds a Kimi-K2.5-shaped config.json. Output: JSON facts the test asserts on: SGLang's own reading
of the config, the capture ids SGLang's own `set_eagle3_layers_to_capture` derives from ours (Kimi-K2.5's
class, DeepSeek-V3's and Llama's), and whether the SGLang calls our worker makes match SGLang's signatures.
"""

from __future__ import annotations

import argparse
import inspect
import json
import sys
from types import SimpleNamespace

import torch

from eaglepipe.hidden.backends.sglang_worker import server_arguments, version_problem
from eaglepipe.target.layer_ids import sglang_capture_ids


def layers_sglang_captures(model_class: type, num_layers: int, ids: list[int], nested: bool) -> list[int]:
    """Run SGLang's own `set_eagle3_layers_to_capture` on a model object without weights."""
    language_model = model_class.__new__(model_class) if not nested else None
    if nested:  # Kimi-K2.5 delegates to its DeepSeek-V3 language model
        from sglang.srt.models.deepseek_v2 import DeepseekV3ForCausalLM

        language_model = DeepseekV3ForCausalLM.__new__(DeepseekV3ForCausalLM)
    torch.nn.Module.__init__(language_model)
    language_model.config = SimpleNamespace(num_hidden_layers=num_layers)
    language_model.pp_group = SimpleNamespace(is_last_rank=True)  # one pipeline stage, as the worker runs
    language_model.model = SimpleNamespace(layers_to_capture=[])
    outer = language_model
    if nested:
        outer = model_class.__new__(model_class)
        torch.nn.Module.__init__(outer)
        outer.language_model = language_model
    outer.set_eagle3_layers_to_capture(ids)
    assert language_model.capture_aux_hidden_states
    return list(language_model.model.layers_to_capture)


def parameters(function) -> list[str]:
    return list(inspect.signature(function).parameters)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("target")
    parser.add_argument("out")
    parser.add_argument("--drafter", help="an exported drafter directory for this target")
    args = parser.parse_args()

    import sglang
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.layers.logits_processor import LogitsProcessor
    from sglang.srt.managers.schedule_batch import Req, ScheduleBatch
    from sglang.srt.mem_cache.cache_init_params import CacheInitParams
    from sglang.srt.mem_cache.chunk_cache import ChunkCache
    from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode, ForwardBatch
    from sglang.srt.model_executor.model_runner import ModelRunner
    from sglang.srt.models.deepseek_v2 import DeepseekV3ForCausalLM
    from sglang.srt.models.kimi_k25 import KimiK25ForConditionalGeneration
    from sglang.srt.models.llama import LlamaForCausalLM
    from sglang.srt.server_args import ServerArgs

    worker_args = SimpleNamespace(
        target=args.target, dtype="bfloat16", tensor_parallel=8, context_length=20001, memory_fraction=0.85
    )
    server_args = ServerArgs(**server_arguments(worker_args))
    model_config = ModelConfig.from_server_args(server_args)
    ours = sglang_capture_ids([1, 29, 57])
    facts = {
        "version": sglang.__version__,
        "version_problem": version_problem(),
        "server_args": {
            name: getattr(server_args, name)
            for name in (
                "tp_size",
                "context_length",
                "disable_radix_cache",
                "chunked_prefill_size",
                "disable_cuda_graph",
                "enable_return_hidden_states",
                "skip_tokenizer_init",
                "mem_fraction_static",
            )
        },
        "model_config": {
            "architecture": model_config.hf_config.architectures[0],
            "num_hidden_layers": model_config.num_hidden_layers,
            "hidden_size": model_config.hidden_size,
            "text_model_type": model_config.hf_text_config.model_type,
        },
        "capture": {
            "ours": ours,
            "kimi_k25": layers_sglang_captures(KimiK25ForConditionalGeneration, 61, ours, nested=True),
            "deepseek_v3": layers_sglang_captures(DeepseekV3ForCausalLM, 61, ours, nested=False),
            "llama": layers_sglang_captures(LlamaForCausalLM, 30, [1, 14, 26], nested=False),
            "deepseek_v3_first_id_2": layers_sglang_captures(
                DeepseekV3ForCausalLM, 61, [2, 29, 57], nested=False
            ),
        },
        "signatures": {
            "LogitsProcessor.forward": parameters(LogitsProcessor.forward),
            "ModelRunner.__init__": parameters(ModelRunner.__init__),
            "ModelRunner.methods": [
                name
                for name in ("alloc_memory_pool", "init_attention_backends", "forward")
                if callable(getattr(ModelRunner, name, None))
            ],
            "Req.__init__": parameters(Req.__init__),
            "Req.init_next_round_input": parameters(Req.init_next_round_input),
            "ScheduleBatch.init_new": parameters(ScheduleBatch.init_new),
            "ScheduleBatch.prepare_for_extend": parameters(ScheduleBatch.prepare_for_extend),
            "CacheInitParams": list(CacheInitParams.__dataclass_fields__),
            "ChunkCache.__init__": parameters(ChunkCache.__init__),
            "ForwardBatch.init_new": parameters(ForwardBatch.init_new),
            "CaptureHiddenMode.FULL": CaptureHiddenMode.FULL.name,
        },
    }
    if args.drafter:
        facts["drafter"] = drafter_facts(args.drafter, server_args, model_config.num_hidden_layers)
    with open(args.out, "w") as handle:
        json.dump(facts, handle, indent=1, default=str)


def drafter_facts(drafter_dir: str, target_args, num_layers: int) -> dict:
    """How SGLang reads an exported drafter beside this target: the draft's config as its ModelRunner loads
    it, the aux-layer ids it hands the target, and the layers Kimi-K2.5's and DeepSeek-V3's classes then
    capture (input-of-layer ids)."""
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.models.deepseek_v2 import DeepseekV3ForCausalLM
    from sglang.srt.models.kimi_k25 import KimiK25ForConditionalGeneration

    draft = ModelConfig.from_server_args(target_args, model_path=drafter_dir, is_draft_model=True)
    hf = draft.hf_config
    ids = hf.eagle_config["eagle_aux_hidden_state_layer_ids"]  # what ModelRunner passes the target
    return {
        "architecture": hf.architectures[0],
        "geometry": {k: getattr(hf, k) for k in ("hidden_size", "num_attention_heads", "num_key_value_heads",
                                                 "head_dim", "intermediate_size", "vocab_size",
                                                 "draft_vocab_size", "target_hidden_size")},
        "layer_ids_read": list(ids),
        "kimi_k25_captures": layers_sglang_captures(KimiK25ForConditionalGeneration, num_layers, ids, True),
        "deepseek_v3_captures": layers_sglang_captures(DeepseekV3ForCausalLM, num_layers, ids, False),
    }


if __name__ == "__main__":
    sys.exit(main())
