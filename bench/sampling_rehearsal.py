"""The token stage at the real run's sampling on the Kimi-K2.5-shaped tiny target, through real vLLM: vLLM
0.32's offline engine samples every demo prompt's answer at temperature 1.0 (top_p 0.95, seeded) from the
prompt ids the token stage renders (tests/support/engines/vllm_sample.py), those ids go through vLLM's own
serving path, detokenizer and Kimi parsers, as a provider running vLLM returns them, streamed and not
(tests/support/engines/vllm_side.py), and the token stage reads the replies with their true ids: the
round-trip gate rebuilds each from its text alone and tells what truly differs.

    .venv/bin/python bench/sampling_rehearsal.py [--max-tokens 512] [--min-tokens 0] [--per-set 24]

`--min-tokens N` holds the stop back for N tokens: the tiny target, trained to answer briefly, writes
hundreds of tokens only so. Prints the same table as bench/round_trip.py, per serving mode.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))  # the engines' harness (`support.engines`)
sys.path.insert(0, str(REPO / "bench"))
from round_trip import print_yield  # noqa: E402
from support.engines.corpus import ENGINES, engine_model_dir, run_engine  # noqa: E402

from eaglepipe.layout import RunLayout  # noqa: E402
from eaglepipe.target.chat_format import chat_format_for  # noqa: E402
from eaglepipe.target.load import load_target_tokenizer  # noqa: E402
from eaglepipe.tokens.build import build_tokens  # noqa: E402
from eaglepipe.tokens.rebuild import TokenSettings  # noqa: E402

SOURCES = REPO / "resources" / "sources" / "demo"
VLLM_ENV = {**os.environ, "PYTHONPATH": str(REPO / "tests")}  # vllm_sample.py imports tests/vllm_drafter.py
SETS = ("demo-chat", "demo-code", "demo-math", "demo-multiturn", "demo-tools")
# Nothing dropped here, so a set whose every answer is off (the tiny target forced past its stop) is still
# measured; the table says what the token stage's defaults would keep.
SETTINGS = TokenSettings(
    on_mismatch="keep", on_ambiguous="keep", on_segmentation="keep", tool_format="typescript", providers={}
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", type=Path, default=REPO / "resources" / "models" / "kimi-k25-tiny")
    parser.add_argument("--per-set", type=int, default=24)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--top-p", type=float, default=0.95)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--max-tokens", type=int, default=512)
    parser.add_argument("--min-tokens", type=int, default=0)
    parser.add_argument("--keep", type=Path, help="keep the scratch directory here")
    args = parser.parse_args()
    chat = chat_format_for(load_target_tokenizer(args.target))
    prompts = []
    for name in SETS:
        lines = (SOURCES / f"{name}.jsonl").read_text().splitlines()[: args.per_set]
        prompts += [{"id": f"{name}-{i}", **json.loads(line)} for i, line in enumerate(lines)]
    with tempfile.TemporaryDirectory(prefix="eaglepipe-sampling-") as scratch:
        work = args.keep or Path(scratch)
        work.mkdir(parents=True, exist_ok=True)
        inputs = [
            {
                "key": p["id"],
                "prompt_ids": chat.prompt_ids(
                    p["messages"], p.get("tools"), thinking=True, tool_format="typescript"
                ),
            }
            for p in prompts
        ]
        (work / "prompt_ids.jsonl").write_text("".join(json.dumps(i) + "\n" for i in inputs))
        sampled = work / "sampled.jsonl"
        command = [
            str(REPO / ".venv-vllm" / "bin" / "python"),
            str(REPO / "tests/support/engines/vllm_sample.py"),
            str(args.target),
            str(work / "prompt_ids.jsonl"),
            str(sampled),
            "--stop-id",
            str(chat.layout.stop),
            "--temperature",
            str(args.temperature),
            "--top-p",
            str(args.top_p),
            "--seed",
            str(args.seed),
            "--max-tokens",
            str(args.max_tokens),
            "--min-tokens",
            str(args.min_tokens),
            "--mla",
        ]
        if not sampled.is_file():  # a kept directory's samples are reused
            done = subprocess.run(command, capture_output=True, text=True, env=VLLM_ENV)
            if done.returncode != 0:
                sys.exit(f"vLLM's sampling failed:\n{done.stderr[-4000:]}")
        answers = {line["key"]: line for line in map(json.loads, sampled.read_text().splitlines())}
        engine_inputs = [
            {
                "key": p["id"],
                "messages": p["messages"],
                "tools": p.get("tools"),
                "thinking": True,
                "stopped": answers[p["id"]]["stopped"],
                "prompt_ids": i["prompt_ids"],
                "completion_ids": answers[p["id"]]["completion_ids"],
            }
            for p, i in zip(prompts, inputs, strict=True)
        ]
        (work / "engine_inputs.jsonl").write_text("".join(json.dumps(e) + "\n" for e in engine_inputs))
        replies = (
            [json.loads(line) for line in (work / "vllm.jsonl").read_text().splitlines()]
            if (work / "vllm.jsonl").is_file()
            else run_engine(
                ENGINES["vllm"],
                engine_model_dir(args.target, work / "model"),
                work / "engine_inputs.jsonl",
                work / "vllm.jsonl",
            )
        )
        by_mode: dict[str, dict] = {}
        for mode in ("whole", "stream"):
            layout = RunLayout.from_paths(work / mode, work / mode / "prompts")
            records = [
                _record(reply, answers[reply["key"]], len(engine_inputs[k]["prompt_ids"]))
                for k, reply in enumerate(r for r in replies if r["mode"] == mode)
            ]
            by_mode[f"vllm {mode}"] = {
                name: _token_stage(layout, args.target, prompts, records, name) for name in SETS
            }
    lengths = Counter(len(a["completion_ids"]) for a in answers.values())
    print(
        f"{args.target.name}: {len(prompts)} prompts, temperature {args.temperature:g}, "
        f"top_p {args.top_p:g}, "
        f"seed {args.seed}, max_tokens {args.max_tokens}, min_tokens {args.min_tokens}; "
        f"mean answer {sum(k * n for k, n in lengths.items()) / len(prompts):.0f} tokens"
    )
    print_yield(by_mode)


def _token_stage(
    layout: RunLayout, target: Path, prompts: list[dict], records: list[dict], name: str
) -> dict:
    """One demo set's records through the token stage (its tokens.json lists up to 50 misses)."""
    layout.set_dir(name).mkdir(parents=True, exist_ok=True)
    layout.prompts.mkdir(parents=True, exist_ok=True)
    mine = [p for p in prompts if p["id"].startswith(f"{name}-")]
    ids = {p["id"] for p in mine}
    answered = [r for r in records if r["prompt_id"] in ids]
    layout.prompt_set(name).write_text("".join(json.dumps(p) + "\n" for p in mine))
    layout.responses(name).write_text("".join(json.dumps(r) + "\n" for r in answered))
    stats = build_tokens(
        layout.prompt_set(name),
        layout.responses(name),
        target,
        layout.tokens(name),
        layout.token_stats(name),
        SETTINGS,
    )
    return {"tokens": stats, "responses": answered}


def _record(reply: dict, answer: dict, prompt_length: int) -> dict:
    """The responses.jsonl record of a provider running vLLM in the reply's mode, with its true ids."""
    ids = answer["completion_ids"]
    return {
        "prompt_id": reply["key"],
        "provider": f"vllm-{reply['mode']}",
        "request": {"reasoning": {"enabled": True}},
        "response": {
            "reasoning": reply["reasoning"],
            "content": reply["content"] or "",
            "tool_calls": [
                {
                    "id": c["id"],
                    "type": "function",
                    "function": {"name": c["name"], "arguments": c["arguments"]},
                }
                for c in reply["tool_calls"]
            ],
            "finish_reason": "stop" if answer["stopped"] else "length",
            "token_ids": ids[:-1] if answer["stopped"] else ids,
        },
        "usage": {"prompt_tokens": prompt_length, "completion_tokens": len(ids), "cost": 0.0},
    }


if __name__ == "__main__":
    main()
