"""Decode throughput of the local model: one process on two threads against two processes on one each.

The local profile generates two prompt sets at once, each emulator's model on one thread, instead of one
set on both cores. This measures why, in one run: the same 24-row decode steps (greedy, in-place KV
cache) timed in one process with `torch.set_num_threads(2)`, then in two processes at once with one
thread each, and prints rows decoded per second for each layout.

    .venv/bin/python bench/emulator_threads.py --target resources/models/smollm2-135m-instruct
"""

from __future__ import annotations

import argparse
import multiprocessing
import time
from pathlib import Path

import torch

from eaglepipe.target.kv_cache import as_growing
from eaglepipe.target.load import load_target


def decode_seconds(target: Path, threads: int, rows: int, prompt: int, steps: int, start: object) -> float:
    """Seconds of `steps` decode steps of `rows` rows after a `prompt`-token prefill (not timed)."""
    torch.set_num_threads(threads)
    model = load_target(target)
    ids = torch.randint(100, 20000, (rows, prompt), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        out = model(input_ids=ids, use_cache=True, logits_to_keep=1)
        cache, token = as_growing(out.cache, steps), out.logits[:, -1].argmax(-1)
        if start is not None:
            start.wait()  # both processes decode at the same time
        began = time.perf_counter()
        for _ in range(steps):
            out = model(input_ids=token[:, None], cache=cache, use_cache=True)
            cache, token = out.cache, out.logits[:, -1].argmax(-1)
        return time.perf_counter() - began


def _worker(args: tuple) -> float:
    return decode_seconds(*args)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--target", required=True, type=Path)
    parser.add_argument("--rows", type=int, default=24)
    parser.add_argument("--prompt", type=int, default=40)
    parser.add_argument("--steps", type=int, default=48)
    args = parser.parse_args()
    shape = (args.rows, args.prompt, args.steps)

    one = decode_seconds(args.target, 2, *shape, None)
    context = multiprocessing.get_context("spawn")
    with context.Manager() as manager, context.Pool(2) as pool:
        two = pool.map(_worker, [(args.target, 1, *shape, manager.Barrier(2))] * 2)
    decoded = args.rows * args.steps
    print(f"{args.rows} rows, {args.steps} decode steps after a {args.prompt}-token prompt")
    print(f"one process, 2 threads:  {one:.1f} s, {decoded / one:.0f} rows/s")
    print(f"two processes, 1 thread: {max(two):.1f} s, {2 * decoded / max(two):.0f} rows/s (both together)")
    print(f"ratio: {(2 * decoded / max(two)) / (decoded / one):.2f}")


if __name__ == "__main__":
    main()
