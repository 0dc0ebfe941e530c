"""Greedy generation with real vLLM, with and without exported EAGLE-3 drafters; what vLLM did, as JSON.

Run it with the vLLM environment's interpreter (`make vllm-env`, then `.venv-vllm/bin/python
tests/vllm_drafter.py ...`): it imports only vLLM and the standard library, as the project's environment has
no vLLM and vLLM's has no eaglepipe. Prompts are token ids, sent one at a time so that vLLM's
speculative-decoding counters can be read per prompt. The aux-layer ids vLLM feeds the drafter are only
logged by vLLM: read them from this script's output (stdout and stderr as one stream), where each run's
lines follow a line `RUN_MARK <its out file>`.

The runs (`--runs`: the target alone, then each drafter) share one process. A drafter is part of vLLM's
engine configuration, so each run builds its own engine; in-process (the engine core and its worker in
this process: `VLLM_ENABLE_V1_MULTIPROCESSING=0`, the `uni` executor) that takes about two seconds where
a process per run spent about 40 s starting vLLM's three processes and importing vLLM in each, and
generation, with no process boundary to cross per step, is faster too (tests/test_kimi_engines.py's three
runs on the tiny Kimi-K2.5: 32 s against 84 s in one process with the default engine processes).

With an MLA target (DeepSeek-V3, Kimi-K2.5) and a drafter on a CPU, set EAGLEPIPE_TEST_CPU_ATTN_BLOCK16=1 for
the test-only plugin `make vllm-env` installs (tests/vllm_cpu_block16/).

Output, per run: {"outputs": [token ids per prompt], "per_prompt": [{"drafts", "accepted_drafts",
"accepted_per_position"}] (with a drafter)}. vLLM counts a draft round ("drafts") per verify step and
counts accepted drafts even when max_tokens or the stop token cuts them.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

SPEC_COUNTERS = {
    "vllm:spec_decode_num_drafts": "drafts",
    "vllm:spec_decode_num_accepted_tokens": "accepted_drafts",
}
PER_POSITION = "vllm:spec_decode_num_accepted_tokens_per_pos"


def spec_decode_counters(llm: Any) -> dict[str, Any]:
    counters: dict[str, Any] = {"drafts": 0, "accepted_drafts": 0, "accepted_per_position": []}
    for metric in llm.get_metrics():
        if metric.name in SPEC_COUNTERS:
            counters[SPEC_COUNTERS[metric.name]] = int(metric.value)
        elif metric.name == PER_POSITION:
            counters["accepted_per_position"] = [int(v) for v in metric.values]
    return counters


def tolerate_llvmlite_in_the_kernel_scan() -> None:
    """In-process, vLLM's worker start scans every loaded module for Triton kernels and reads `vars()` of
    each object in them. By then the Kimi-K2.5 model class has loaded numba and with it llvmlite, whose lazy
    library object answers `__dict__` with a wrapped C function, and the scan fails on it; a worker in its
    own process starts before the model class is loaded. An empty `__dict__` entry lets the scan pass by."""
    try:
        from llvmlite.binding import ffi
    except ImportError:
        return
    ffi.lib._fntab["__dict__"] = {}


def generate(llm: Any, prompts: list[list[int]], max_tokens: int, speculative: bool) -> dict[str, Any]:
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    sampling = SamplingParams(temperature=0.0, max_tokens=max_tokens)
    outputs, per_prompt = [], []
    for prompt in prompts:
        before = spec_decode_counters(llm)
        [result] = llm.generate([TokensPrompt(prompt_token_ids=prompt)], sampling, use_tqdm=False)
        after = spec_decode_counters(llm)
        outputs.append(list(result.outputs[0].token_ids))
        per_position = [
            a - b
            for a, b in zip(
                after["accepted_per_position"],
                before["accepted_per_position"] or [0] * len(after["accepted_per_position"]),
                strict=True,
            )
        ]
        per_prompt.append(
            {
                "drafts": after["drafts"] - before["drafts"],
                "accepted_drafts": after["accepted_drafts"] - before["accepted_drafts"],
                "accepted_per_position": per_position,
            }
        )
    report: dict[str, Any] = {"outputs": outputs}
    if speculative:
        report["per_prompt"] = per_prompt
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--target", required=True, help="the target model directory")
    parser.add_argument("--prompts", required=True, type=Path, help="JSON list of prompts as token-id lists")
    parser.add_argument(
        "--runs",
        required=True,
        type=json.loads,
        help='JSON list of {"out": report file, "drafter": an exported EAGLE-3 drafter directory or null}, or'
        ' {"out", "alone": a speculators-format folder, served by itself as `vllm serve FOLDER` serves it}',
    )
    parser.add_argument("--num-speculative-tokens", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, required=True)
    parser.add_argument("--max-model-len", type=int, default=2048)
    parser.add_argument("--language-model-only", action="store_true", help="a multimodal target (Kimi-K2.5)")
    parser.add_argument("--mla", action="store_true", help="an MLA target: vLLM's reference CPU MLA kernel")
    args = parser.parse_args()

    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")  # GiB of KV cache; vLLM's default takes far more
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    from vllm import LLM

    tolerate_llvmlite_in_the_kernel_scan()

    engine: dict[str, Any] = {}
    if args.language_model_only:
        engine["language_model_only"] = True
    if args.mla:  # vLLM's AMX MLA kernels (picked where the CPU has AMX) take bf16 weights only
        engine["attention_backend"] = "CPU_MLA"
    prompts = json.loads(args.prompts.read_text())
    for run in args.runs:
        print(f"RUN_MARK {run['out']}", file=sys.stderr, flush=True)
        speculative_config = None
        if run["drafter"]:
            speculative_config = {
                "method": "eagle3",
                "model": run["drafter"],
                "num_speculative_tokens": args.num_speculative_tokens,
            }
        llm = LLM(
            # A speculators-format folder alone: vLLM reads the verifier's name from its config.
            model=run.get("alone") or args.target,
            dtype="float32",
            enforce_eager=True,
            max_model_len=args.max_model_len,
            seed=0,
            speculative_config=speculative_config,
            disable_log_stats=False,  # the speculative-decoding counters
            skip_tokenizer_init=True,  # prompts are ids; the stop id comes from generation_config.json
            distributed_executor_backend="uni",
            **engine,
        )
        speculative = speculative_config is not None or bool(run.get("alone"))
        report = generate(llm, prompts, args.max_tokens, speculative)
        Path(run["out"]).write_text(json.dumps(report))
        llm.llm_engine.engine_core.shutdown()  # frees the KV cache before the next run's engine takes its own
        del llm


if __name__ == "__main__":
    main()
