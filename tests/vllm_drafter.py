"""Greedy generation with real vLLM, with or without an exported EAGLE-3 drafter; what vLLM did, as JSON.

Run it with the vLLM environment's interpreter (`make vllm-env`, then `.venv-vllm/bin/python
tests/vllm_drafter.py ...`): it imports only vLLM and the standard library, as the project's environment has
no vLLM and vLLM's has no eaglepipe. Prompts are token ids, sent one at a time so that vLLM's
speculative-decoding counters can be read per prompt. The aux-layer ids vLLM feeds the drafter are only
logged by vLLM: read them from this script's stderr.

With an MLA target (DeepSeek-V3, Kimi-K2.5) and a drafter on a CPU, set EAGLEPIPE_TEST_CPU_ATTN_BLOCK16=1 for
the test-only plugin `make vllm-env` installs (tests/vllm_cpu_block16/).

Output: {"outputs": [token ids per prompt], "per_prompt": [{"drafts", "accepted_drafts",
"accepted_per_position"}] (with a drafter)}. vLLM counts a draft round ("drafts") per verify step and
counts accepted drafts even when max_tokens or the stop token cuts them.
"""

from __future__ import annotations

import argparse
import json
import os
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--target", required=True, help="the target model directory")
    parser.add_argument("--prompts", required=True, type=Path, help="JSON list of prompts as token-id lists")
    parser.add_argument("--out", required=True, type=Path, help="where the JSON report goes")
    parser.add_argument("--drafter", help="an exported EAGLE-3 drafter directory; none: the target alone")
    parser.add_argument("--num-speculative-tokens", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, required=True)
    parser.add_argument("--max-model-len", type=int, default=2048)
    parser.add_argument("--language-model-only", action="store_true", help="a multimodal target (Kimi-K2.5)")
    parser.add_argument("--mla", action="store_true", help="an MLA target: vLLM's reference CPU MLA kernel")
    args = parser.parse_args()

    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")  # GiB of KV cache; vLLM's default takes far more
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    speculative_config = None
    if args.drafter:
        speculative_config = {
            "method": "eagle3",
            "model": args.drafter,
            "num_speculative_tokens": args.num_speculative_tokens,
        }
    engine: dict[str, Any] = {}
    if args.language_model_only:
        engine["language_model_only"] = True
    if args.mla:  # vLLM's AMX MLA kernels (picked where the CPU has AMX) take bf16 weights only
        engine["attention_backend"] = "CPU_MLA"
    llm = LLM(
        model=args.target,
        dtype="float32",
        enforce_eager=True,
        max_model_len=args.max_model_len,
        seed=0,
        speculative_config=speculative_config,
        disable_log_stats=False,  # the speculative-decoding counters
        skip_tokenizer_init=True,  # prompts are ids; the stop id comes from generation_config.json
        **engine,
    )
    sampling = SamplingParams(temperature=0.0, max_tokens=args.max_tokens)
    outputs, per_prompt = [], []
    for prompt in json.loads(args.prompts.read_text()):
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
    if args.drafter:
        report["per_prompt"] = per_prompt
    args.out.write_text(json.dumps(report))


if __name__ == "__main__":  # vLLM spawns worker processes that import this module
    main()
