"""`python -m support.emulator --model-dir DIR | --synthetic` (tests/ on the path): the package's server
with the tests' modes.

`--synthetic` serves made-up answers at a provider's pace with no model at all (torch is never imported),
to rehearse thousands of requests in flight; `--synthetic --kimi-corpus DIR` serves the offline Kimi
corpus with each endpoint's reply habits (kimi_mode.py); `--faults FILE` (any mode) injects failures
(fault_plan.py, through the server's hook: fault_source.py), and `POST /api/v1/emulator/faults` replaces
them live. Everything else is `python -m eaglepipe.emulator`'s.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from eaglepipe.emulator.__main__ import Setup, build_parser, check_args, model_setup, refuse_habits, serve
from eaglepipe.emulator.providers import load_endpoints
from support.emulator.fault_plan import load_faults
from support.emulator.fault_source import PlannedFaults, faults_route
from support.emulator.injected import hide_injected_resets

# Synthetic-mode options: (default, lowest allowed); they mean nothing to a model.
SYNTHETIC_OPTIONS: dict[str, tuple[float, float]] = {
    "mean_tokens": (300.0, 1.0),
    "length_sigma": (1.0, 0.0),
    "tokens_per_s": (50.0, 0.0),
    "latency_s": (0.2, 0.0),
    "context_length": (262_144, 2),
}
HABITS_HINT = "--synthetic --kimi-corpus DIR, or --model-dir with Kimi's tokenizer files"


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser, source = build_parser("python -m support.emulator", __doc__.splitlines()[0])
    source.add_argument("--synthetic", action="store_true", help="serve made-up answers, no model")
    parser.add_argument("--faults", type=Path, metavar="FILE", help="YAML/JSON list of fault rules to inject")
    parser.add_argument("--fault-seed", type=int, default=0, help="seed of the fault draws")
    synthetic = parser.add_argument_group("synthetic mode")
    synthetic.add_argument("--mean-tokens", type=float, help="mean answer length in tokens (300)")
    synthetic.add_argument("--length-sigma", type=float, help="lognormal shape of answer lengths (1.0)")
    synthetic.add_argument("--tokens-per-s", type=float, help="decode rate per request, 0 = instant (50)")
    synthetic.add_argument("--latency-s", type=float, help="seconds to the first token (0.2)")
    synthetic.add_argument("--context-length", type=int, help="the model's context length (262144)")
    synthetic.add_argument("--seed", type=int, help="seed of the answers (default: a new one each start)")
    kimi = parser.add_argument_group("Kimi mode (with --synthetic; endpoints' `habits` shape the answers)")
    kimi.add_argument(
        "--kimi-corpus",
        type=Path,
        metavar="DIR",
        help="answer from the offline Kimi corpus built with the Kimi-layout tokenizer in DIR",
    )
    kimi.add_argument("--kimi-count", type=int, default=200, help="samples in the corpus (200)")
    kimi.add_argument("--kimi-seed", type=int, default=0, help="seed of the corpus (0)")
    args = parser.parse_args(argv)
    check_args(parser, args)
    given = [name for name in [*SYNTHETIC_OPTIONS, "seed"] if getattr(args, name) is not None]
    if args.model_dir is not None and given:
        parser.error(f"--{given[0].replace('_', '-')} applies only with --synthetic")
    if args.kimi_corpus is not None and not args.synthetic:
        parser.error("--kimi-corpus applies only with --synthetic")
    if args.kimi_count < 1:
        parser.error("--kimi-count must be at least 1")
    if args.synthetic and args.text_like is not None:
        parser.error("--text-like applies only with --model-dir (synthetic words have no special tokens)")
    for name, (default, lowest) in SYNTHETIC_OPTIONS.items():
        value = getattr(args, name)
        if value is None:
            setattr(args, name, default)
        elif value < lowest:
            parser.error(f"--{name.replace('_', '-')} must be at least {lowest:g}")
    if args.length_sigma > 4:
        parser.error("--length-sigma above 4 gives lengths beyond any context; use 0 to 4")
    return args


def _synthetic_setup(args: argparse.Namespace) -> Setup:
    from support.emulator.synthetic import Pace, SyntheticEngine, WordText

    endpoints = load_endpoints(args.config, args.model_id, args.context_length)
    pace = Pace(latency_s=args.latency_s, tokens_per_s=args.tokens_per_s)
    if args.kimi_corpus is None:
        refuse_habits(args, endpoints, HABITS_HINT)
        engine = SyntheticEngine(
            pace=pace, mean_tokens=args.mean_tokens, length_sigma=args.length_sigma, seed=args.seed
        )
        return Setup(args.context_length, endpoints, lambda: (engine, WordText(), None), "synthetic answers")
    from support.emulator.kimi_mode import KimiCorpus, KimiEngine, KimiReplies, KimiText

    # The corpus is built (seconds for a few hundred samples) before the port is bound.
    corpus = KimiCorpus.build(args.kimi_corpus, args.kimi_count, args.kimi_seed)
    backend = KimiEngine(corpus, pace), KimiText(corpus), KimiReplies(corpus)
    source = f"the Kimi corpus ({args.kimi_count} samples, seed {args.kimi_seed})"
    return Setup(args.context_length, endpoints, lambda: backend, source)


def setup(args: argparse.Namespace) -> Setup:
    faults = PlannedFaults(load_faults(args.faults, args.fault_seed))
    served = _synthetic_setup(args) if args.synthetic else model_setup(args, HABITS_HINT)
    logging.getLogger("uvicorn.error").addFilter(hide_injected_resets)
    return replace(
        served,
        faults=faults,
        routes=lambda emulator: [faults_route(emulator, args.fault_seed)],
        source=served.source + (f", faults from {args.faults}" if args.faults else ""),
    )


def main(argv: Sequence[str] | None = None) -> int:
    return serve(parse_args(argv), setup)


if __name__ == "__main__":
    sys.exit(main())
