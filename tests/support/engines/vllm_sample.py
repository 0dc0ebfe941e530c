"""Run inside vLLM's environment (`make vllm-env`): real vLLM samples a target's answers from prompt ids.

For each input line (`key`, `prompt_ids`) vLLM 0.32's offline engine generates on the CPU with the given
sampling (temperature, top_p, a seed per request, `max_tokens`, the stop id), the tokenizer never loaded
(Kimi's needs remote code; the ids are all the engine needs). `--min-tokens` holds the stop back that long,
for answers longer than a tiny target writes by itself. Writes one line per input: `key`, the generated
`completion_ids` (the stop id last when it stopped) and `stopped`.

    PYTHONPATH=tests .venv-vllm/bin/python tests/support/engines/vllm_sample.py MODEL IN.jsonl OUT.jsonl \\
        --stop-id ID [--mla] [--temperature 1.0] [--top-p 0.95] [--seed 7] [--max-tokens 512] [--min-tokens 0]
"""

from __future__ import annotations

import argparse
import json
import os


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("model_dir")
    parser.add_argument("inputs")
    parser.add_argument("out")
    parser.add_argument("--stop-id", type=int, required=True)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--top-p", type=float, default=0.95)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--max-tokens", type=int, default=512)
    parser.add_argument("--min-tokens", type=int, default=0)
    parser.add_argument("--max-model-len", type=int, default=4096)
    parser.add_argument("--mla", action="store_true", help="an MLA target: vLLM's reference CPU MLA kernel")
    args = parser.parse_args()
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")  # GiB; vLLM's default takes far more
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the engine in this process: seconds, not minutes
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt
    from vllm_drafter import tolerate_llvmlite_in_the_kernel_scan

    tolerate_llvmlite_in_the_kernel_scan()

    with open(args.inputs) as lines:
        samples = [json.loads(line) for line in lines]
    llm = LLM(
        model=args.model_dir,
        dtype="float32",
        max_model_len=args.max_model_len,
        enforce_eager=True,
        skip_tokenizer_init=True,
        language_model_only=True,
        seed=args.seed,
        distributed_executor_backend="uni",
        **({"attention_backend": "CPU_MLA"} if args.mla else {}),
    )
    params = [
        SamplingParams(
            temperature=args.temperature,
            top_p=args.top_p,
            seed=args.seed + number,
            max_tokens=args.max_tokens,
            min_tokens=args.min_tokens,
            stop_token_ids=[args.stop_id],
            detokenize=False,
        )
        for number in range(len(samples))
    ]
    outputs = llm.generate([TokensPrompt(prompt_token_ids=s["prompt_ids"]) for s in samples], params)
    with open(args.out, "w") as out:
        for sample, output in zip(samples, outputs, strict=True):
            ids = list(output.outputs[0].token_ids)
            stopped = output.outputs[0].finish_reason == "stop"
            if stopped and (not ids or ids[-1] != args.stop_id):
                ids.append(args.stop_id)
            out.write(json.dumps({"key": sample["key"], "completion_ids": ids, "stopped": stopped}) + "\n")


if __name__ == "__main__":
    main()
