"""Token-stage reconstruction: throughput on one core, and how each engine switch's replies come out.

    python bench/reconstruction.py [--samples 2000] [--length 10] [--repeats 3] [--shares 400]

A synthetic Kimi corpus (Kimi-layout tokenizer, `tests/support/emulator/kimi_synthetic.py`) is turned into
the replies each engine switch would give, then rebuilt from text (`eaglepipe.tokens.rebuild`) in this one
process, pinned to one CPU: the first table is tokens per second (prompt and completion ids produced,
validation and tensor assembly included; the best of `--repeats`) and the time 60M tokens would take. The
second table: shares of each method per switch, blind (the engine learned from the replies) and informed
(the config names it), and how many rebuilt ids equal the truth.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from eaglepipe.emulator.text_like import SWITCHES, EngineSwitch
from eaglepipe.target.chat_format import ChatFormat, chat_format_for
from eaglepipe.target.kimi_layout import ensure_kimi_layout
from eaglepipe.target.load import load_target_tokenizer
from eaglepipe.tokens.build import sample_tensors
from eaglepipe.tokens.methods import EXACT_METHODS, Method
from eaglepipe.tokens.rebuild import Rebuilder

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from stage_settings import token_settings  # noqa: E402  (the schema's defaults, as the tests build them)

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))  # the tests' `support` package
from support.emulator.kimi_synthetic import kimi_corpus, reply_record  # noqa: E402
from support.pins import pin_for  # noqa: E402

SEEDS_TOKENS = 60_000_000
THROUGHPUT_SWITCHES = ("exact", "vllm", "sglang", "vllm_ids")


def throughput(
    target: ChatFormat, corpus: list, switch: EngineSwitch, repeats: int
) -> tuple[int, int, float]:
    """(tokens, completion tokens, best seconds) for rebuilding the corpus's replies under `switch`."""
    records = [reply_record(target.tokenizer, sample, switch) for sample in corpus]
    prompts = {sample.prompt["id"]: sample.prompt for sample in corpus}
    best, settings = float("inf"), token_settings()
    for _ in range(repeats):
        started = time.process_time()
        rebuilder = Rebuilder(chat_format_for(target.tokenizer), settings)
        rebuilt = rebuilder.rebuild(prompts, records, switch.name)
        sample_tensors(rebuilt.samples)
        best = min(best, time.process_time() - started)
    tokens = sum(len(s.prompt_ids) + len(s.completion_ids) for s in rebuilt.samples)
    return tokens, sum(len(s.completion_ids) for s in rebuilt.samples), best


def shares(target: ChatFormat, corpus: list, switch: EngineSwitch, informed: bool) -> dict[str, float]:
    settings = token_settings(pins={switch.name: pin_for(switch)} if informed else {})
    records = [reply_record(target.tokenizer, sample, switch) for sample in corpus]
    prompts = {sample.prompt["id"]: sample.prompt for sample in corpus}
    rebuilt = Rebuilder(target, settings).rebuild(prompts, records, switch.name)
    methods = Counter(
        "exact" if s.method in EXACT_METHODS else s.method.name.lower() for s in rebuilt.samples
    )
    true = sum(s.completion_ids == t.ids for s, t in zip(rebuilt.samples, corpus, strict=True))
    matched_true = sum(
        s.completion_ids == t.ids
        for s, t in zip(rebuilt.samples, corpus, strict=True)
        if s.method is Method.REBUILT_COUNT_MATCHED
    )
    n = len(corpus)
    return {
        "exact": methods["exact"] / n,
        "count_matched": methods["rebuilt_count_matched"] / n,
        "ambiguous": methods["rebuilt_ambiguous"] / n,
        "off_by_k": methods["rebuilt_off_by_k"] / n,
        "count_matched_true": matched_true / max(1, methods["rebuilt_count_matched"]),
        "ids_true": true / n,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=2000, help="corpus size for the throughput table")
    parser.add_argument(
        "--length", type=int, default=10, help="sentences multiplier (10: ~1,300 tokens/answer)"
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--shares", type=int, default=400, help="corpus size for the shares table (0: skip)")
    args = parser.parse_args()
    cpu = sorted(os.sched_getaffinity(0))[0]
    os.sched_setaffinity(0, {cpu})
    with tempfile.TemporaryDirectory() as scratch:
        tokenizer = load_target_tokenizer(ensure_kimi_layout(Path(scratch) / "kimi").directory)
    target = chat_format_for(tokenizer)
    print(
        f"$ python bench/reconstruction.py --samples {args.samples} --length {args.length} "
        f"--repeats {args.repeats} --shares {args.shares}   (pinned to CPU {cpu})"
    )
    corpus = kimi_corpus(tokenizer, args.samples, seed=0, length=args.length)
    print("\n| switch | samples | tokens | completion tokens | CPU s | tokens/s | 60M tokens |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name in THROUGHPUT_SWITCHES:
        tokens, completion, seconds = throughput(target, corpus, SWITCHES[name], args.repeats)
        print(
            f"| {name} | {len(corpus)} | {tokens:,} | {completion:,} | {seconds:.2f} | "
            f"{tokens / seconds:,.0f} | {SEEDS_TOKENS / (tokens / seconds):.0f} s |"
        )
    if args.shares:
        small = kimi_corpus(tokenizer, args.shares, seed=1)
        print(f"\nShares of {len(small)} samples (count-matched true: of those, ids equal to the truth)\n")
        columns = [
            "switch",
            "engine",
            "exact",
            "count-matched",
            "ambiguous",
            "off by k",
            "count-matched true",
            "ids true",
        ]
        print("| " + " | ".join(columns) + " |")
        print("|---|---|---:|---:|---:|---:|---:|---:|")
        for name, switch in SWITCHES.items():
            for informed in (False, True):
                row = shares(target, small, switch, informed)
                print(
                    f"| {name} | {'informed' if informed else 'blind'} | "
                    + " | ".join(
                        f"{row[k]:.1%}"
                        for k in (
                            "exact",
                            "count_matched",
                            "ambiguous",
                            "off_by_k",
                            "count_matched_true",
                            "ids_true",
                        )
                    )
                    + " |"
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
