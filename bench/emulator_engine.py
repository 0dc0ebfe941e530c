"""The emulator's batched engine with its in-place KV cache against transformers' own cache, in one run.

The same requests (seeded random prompts of 40-160 tokens, greedy, `--max-tokens` each) go through the
engine twice per repeat, once per cache, alternating so that the machine's noise falls on both; it prints
the seconds of each and whether the tokens are identical.

    .venv/bin/python bench/emulator_engine.py --target resources/models/smollm2-135m-instruct
"""

from __future__ import annotations

import argparse
import asyncio
import random
import time
from pathlib import Path

from eaglepipe.emulator import engine as engine_module
from eaglepipe.emulator.backend import GenerationRequest
from eaglepipe.emulator.engine import Engine
from eaglepipe.target.chat import stop_token_id
from eaglepipe.target.load import load_target, load_tokenizer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--target", required=True, type=Path)
    parser.add_argument("--requests", type=int, default=24)
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    model, tokenizer = load_target(args.target), load_tokenizer(args.target)
    rng = random.Random(0)
    prompts = [
        [rng.randrange(100, 20000) for _ in range(rng.randrange(40, 160))] for _ in range(args.requests)
    ]

    async def answer_all(engine: Engine) -> list[list[int]]:
        async def answer(prompt: list[int]) -> list[int]:
            request = GenerationRequest(prompt, max_tokens=args.max_tokens, temperature=0.0)
            return [token.token_id async for token in engine.stream(request)]

        return await asyncio.gather(*(answer(p) for p in prompts))

    in_place = engine_module.as_growing
    caches = {"in place": in_place, "transformers": lambda cache, room: cache}
    seconds: dict[str, list[float]] = {name: [] for name in caches}
    tokens: dict[str, list[list[int]]] = {}
    for _ in range(args.repeats):
        for name, make_cache in caches.items():
            engine_module.as_growing = make_cache
            engine = Engine(model, stop_token_id(tokenizer), tokenizer.pad_token_id, max_batch=args.requests)
            engine.start()
            started = time.perf_counter()
            tokens[name] = asyncio.run(answer_all(engine))
            seconds[name].append(time.perf_counter() - started)
            engine.close()
    engine_module.as_growing = in_place
    count = sum(len(t) for t in tokens["in place"])
    print(f"{args.requests} requests, {count} tokens, batch {args.requests}, {args.repeats} repeats")
    for name, runs in seconds.items():
        print(
            f"{name:<13} "
            + "  ".join(f"{s:.1f} s" for s in runs)
            + f"  ({count / min(runs):.0f} tokens/s best)"
        )
    print("tokens identical:", tokens["in place"] == tokens["transformers"])


if __name__ == "__main__":
    main()
