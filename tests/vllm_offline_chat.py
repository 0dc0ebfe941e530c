"""Under vLLM's interpreter: greedy answers to chat requests from vLLM's offline `LLM.chat`, as token ids.

The reference the engine source's recorded ids are checked against: the same engine, no server between.
Usage: python vllm_offline_chat.py --model DIR --requests requests.json --max-tokens N --out out.json
"""

from __future__ import annotations

import argparse
import json
import os


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--requests", required=True, help="a JSON list of message lists")
    parser.add_argument("--max-tokens", type=int, required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")  # GiB of KV cache; vLLM's default takes far more

    from vllm import LLM, SamplingParams

    with open(args.requests) as handle:
        conversations = json.load(handle)
    llm = LLM(model=args.model, enforce_eager=True, max_model_len=2048, seed=0)
    # One at a time: a batch's shape changes the CPU kernels' sums in the last bits, enough to flip a
    # greedy near-tie; the job under test sends one request at a time too.
    sampling = SamplingParams(temperature=0.0, max_tokens=args.max_tokens)
    outputs = [llm.chat([conversation], sampling, use_tqdm=False)[0] for conversation in conversations]
    answers = [{"prompt_token_ids": list(out.prompt_token_ids or []),
                "token_ids": list(out.outputs[0].token_ids),
                "finish_reason": out.outputs[0].finish_reason} for out in outputs]
    with open(args.out, "w") as handle:
        json.dump(answers, handle)


if __name__ == "__main__":
    main()
