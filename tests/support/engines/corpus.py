"""Ground truth from the engines: the synthetic Kimi corpus's true ids, and what vLLM and SGLang return.

`engine_corpus` writes each sample's prompt and completion ids, runs every engine's side script in that
engine's own interpreter, and gathers one line per sample, engine and mode (`whole`: a non-streamed
reply; `stream`: the deltas as a client merges them). `engine_record` turns a line into the
responses.jsonl record a provider running that engine would leave, billed as engines bill (every
generated id, the stop token included).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eaglepipe.emulator.text_like import EngineReply
from eaglepipe.target.chat_format import ChatFormat, chat_format_for
from eaglepipe.target.tokenizer import TargetTokenizer
from support.emulator.kimi_synthetic import TrueSample, sample_record

REPO = Path(__file__).resolve().parents[3]
HERE = Path(__file__).resolve().parent
SUPPORT_ROOT = HERE.parents[1]  # tests/: the side scripts and `tokenization_kimi.py` import `support.engines`
MODES = ("whole", "stream")


@dataclass(frozen=True)
class EngineUnderTest:
    """A serving engine this harness drives: its own environment and the side script run in it."""

    name: str
    python: Path  # the interpreter of the engine's own environment
    side: Path  # the script run by it
    pythonpath: tuple[Path, ...]  # entries before the repository (import-only stand-ins)
    make_target: str


ENGINES = {
    "vllm": EngineUnderTest("vllm", REPO / ".venv-vllm/bin/python", HERE / "vllm_side.py", (), "vllm-env"),
    "sglang": EngineUnderTest(
        "sglang",
        REPO / ".venv-sglang/bin/python",
        HERE / "sglang_side.py",
        (REPO / "tests/sglang_cpu",),
        "sglang-env",
    ),
}


class EngineMissing(RuntimeError):
    pass


def engine_model_dir(tokenizer_dir: Path, directory: Path) -> Path:
    """A copy of a Kimi-layout tokenizer directory that engines load with `trust_remote_code`: Moonshot's
    `auto_map`, and a `tokenization_kimi.py` that imports `support.engines.hf_tokenizer`."""
    directory.mkdir(parents=True, exist_ok=True)
    shutil.copy(tokenizer_dir / "tiktoken.model", directory / "tiktoken.model")
    config = json.loads((tokenizer_dir / "tokenizer_config.json").read_text())
    config["auto_map"] = {"AutoTokenizer": ["tokenization_kimi.TikTokenTokenizer", None]}
    (directory / "tokenizer_config.json").write_text(json.dumps(config, indent=1))
    (directory / "tokenization_kimi.py").write_text(
        '"""Kimi-K2.5\'s tokenizer for engines: tests/support/engines/hf_tokenizer.py."""\n\n'
        "from support.engines.hf_tokenizer import TikTokenTokenizer\n\n"
        '__all__ = ["TikTokenTokenizer"]\n'
    )
    return directory


def engine_input(chat_format: ChatFormat, sample: TrueSample) -> dict[str, Any]:
    """What an engine needs to replay the sample: the request, the prompt's ids and the generated ids."""
    prompt = sample.prompt
    return {
        "key": prompt["id"],
        "messages": prompt["messages"],
        "tools": prompt.get("tools"),
        "thinking": sample.thinking,
        "stopped": sample.stopped,
        "prompt_ids": chat_format.prompt_ids(
            prompt["messages"],
            prompt.get("tools"),
            thinking=sample.thinking,
            tool_format="typescript",
        ),
        "completion_ids": sample.ids,
    }


def run_engine(engine: EngineUnderTest, model_dir: Path, inputs: Path, out: Path) -> list[dict[str, Any]]:
    if not engine.python.exists():
        raise EngineMissing(f"{engine.python} is missing: run `make {engine.make_target}`")
    path = [str(p) for p in (*engine.pythonpath, SUPPORT_ROOT, REPO)]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(path),
        "HF_HUB_OFFLINE": "1",
        "HF_MODULES_CACHE": str(out.parent / f"hf_modules_{engine.name}"),
        "VLLM_LOGGING_LEVEL": "ERROR",
    }
    result = subprocess.run(
        [str(engine.python), str(engine.side), str(model_dir), str(inputs), str(out)],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        raise RuntimeError(
            f"{engine.side.name} failed in {engine.python} (exit {result.returncode}); if its environment is "
            f"stale, rebuild it with `make {engine.make_target}`. Its last output:\n{result.stderr[-4000:]}"
        )
    return [json.loads(line) for line in out.read_text().splitlines()]


def engine_corpus(
    tokenizer: TargetTokenizer, tokenizer_dir: Path, samples: list[TrueSample], work: Path, engines: list[str]
) -> list[dict[str, Any]]:
    """Every engine's replies (both modes) to every sample, in sample order."""
    model_dir = engine_model_dir(tokenizer_dir, work / "model")
    inputs = work / "inputs.jsonl"
    chat_format = chat_format_for(tokenizer)
    inputs.write_text("".join(json.dumps(engine_input(chat_format, s)) + "\n" for s in samples))
    return [
        line
        for name in engines
        for line in run_engine(ENGINES[name], model_dir, inputs, work / f"{name}.jsonl")
    ]


def engine_record(
    sample: TrueSample, reply: dict[str, Any], *, with_ids: bool = False, with_logprobs: bool = False
) -> dict[str, Any]:
    """The responses.jsonl record of a provider running `reply`'s engine in its mode (`with_ids`: the
    engine also returned the generated ids, as vLLM's `return_token_ids` does; `with_logprobs`: the
    logprob entries the engine returned, as our client journals them), billed every id."""
    returned = EngineReply(
        reasoning=reply["reasoning"],
        content=reply["content"] or "",
        tool_calls=[
            {"id": c["id"], "type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}}
            for c in reply["tool_calls"]
        ],
        finish_reason="stop" if sample.stopped else "length",
        completion_tokens=len(sample.ids),
        token_ids=sample.answer_ids if with_ids else None,
        logprobs={"content": reply["logprobs"]} if with_logprobs else None,
    )
    provider = f"{reply['engine']}-{reply['mode']}" + ("-ids" if with_ids else "")
    provider += "-logprobs" if with_logprobs else ""
    return sample_record(sample, returned, provider, sample.prompt_lengths["typescript"])


def main() -> None:
    """`PYTHONPATH=tests python -m support.engines.corpus OUT_DIR [COUNT]`: the corpus, for a look by hand."""
    from eaglepipe.target.kimi_layout import ensure_kimi_layout
    from eaglepipe.target.load import load_target_tokenizer
    from support.emulator.kimi_synthetic import kimi_corpus

    out = Path(sys.argv[1])
    count = int(sys.argv[2]) if len(sys.argv) > 2 else 100
    layout = ensure_kimi_layout(out / "tokenizer").directory
    tokenizer = load_target_tokenizer(layout)
    samples = kimi_corpus(tokenizer, count)
    lines = engine_corpus(tokenizer, layout, samples, out, list(ENGINES))
    (out / "corpus.jsonl").write_text("".join(json.dumps(line, ensure_ascii=False) + "\n" for line in lines))
    print(f"{out / 'corpus.jsonl'}: {len(lines)} replies to {count} samples")


if __name__ == "__main__":
    main()
