"""The chaos rehearsal at the real run's concurrency: one set at 2000 in flight against the synthetic
emulator answering a mix of the failure taxonomy's shapes (tests/support/chaos.py: throttling in bursts,
an account window, ~1% transient faults, Chutes going unusable halfway, odd but whole answers), run to the
end, beside the same run without faults on the same machine. It prints whether every prompt was answered
exactly once, the dollars billed against the dollars kept (what was not kept, by ledger outcome and the
failure's class), attempts per answer, and the wall time against the calm run.

    python bench/chaos.py                                   # 6000 prompts at 2000 in flight
    python bench/chaos.py --prompts 600 --in-flight 200     # a smoke run
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))  # `support`, `stage_settings`
from support.chaos import report, run_chaos, shape_mix  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--prompts", type=int, default=6000)
    parser.add_argument("--in-flight", type=int, default=2000)
    parser.add_argument("--mean-tokens", type=float, default=300)
    parser.add_argument("--tokens-per-s", type=float, default=50)
    parser.add_argument("--tokens-per-event", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=2000)
    parser.add_argument("--plain", action="store_true", help="not streamed")
    args = parser.parse_args()
    emulator = [
        "--seed",
        "11",
        "--fault-seed",
        "11",
        "--mean-tokens",
        str(args.mean_tokens),
        "--length-sigma",
        "0.8",
        "--tokens-per-s",
        str(args.tokens_per_s),
        "--latency-s",
        "0.3",
        "--tokens-per-event",
        str(args.tokens_per_event),
    ]
    common = {
        "prompts": args.prompts,
        "concurrency": args.in_flight,
        "emulator_args": emulator,
        "max_tokens": args.max_tokens,
        "stream": not args.plain,
    }
    print(
        f"{args.prompts} prompts, {args.in_flight} in flight, mean {args.mean_tokens:g} tokens at "
        f"{args.tokens_per_s:g} tok/s, {'plain' if args.plain else 'streamed'}",
        flush=True,
    )
    with tempfile.TemporaryDirectory() as scratch:
        calm = run_chaos(Path(scratch) / "calm", faults=None, **common)
        print(f"without faults: {calm.wall_s:.1f} s, {calm.answered_once} answered once", flush=True)
        # Halfway through the sending: at these lengths the last fifth of the wall time or more is the tail.
        mix = shape_mix(unusable_after_s=calm.wall_s / 5)
        faulty = run_chaos(Path(scratch) / "chaos", faults=mix, **common)
    print(report(faulty, calm))


if __name__ == "__main__":
    main()
