"""The driver side of tests/vllm_drafter.py: one vLLM process per target generates with the target alone and
with each drafter, and each run's report and log come back by name."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from eaglepipe.target.architecture import TargetArchitecture

REPO = Path(__file__).resolve().parent.parent
VLLM_PYTHON = REPO / ".venv-vllm" / "bin" / "python"
MARK = "RUN_MARK "


def vllm_python() -> Path:
    if not VLLM_PYTHON.is_file():
        pytest.fail(f"{VLLM_PYTHON} is missing: run `make vllm-env`, or deselect with -m 'not vllm'")
    return VLLM_PYTHON


def run_vllm(
    target: Path,
    prompts: list[list[int]],
    work: Path,
    drafters: dict[str, Path | None],
    *,
    max_tokens: int,
    num_steps: int,
    served_as: str | None = None,
    alone: dict[str, Path] | None = None,
    node: dict[str, str] | None = None,
    cwd: Path | None = None,
) -> dict[str, tuple[dict, str]]:
    """{name: (its report, vLLM's log while it ran)} for each of `drafters` (None: the target alone), then
    each of `alone` (a speculators-format folder served by itself: vLLM takes the verifier from its
    config), in one vLLM process, in that order. vLLM gets the target as `served_as` (a hub name; default
    its path), in `node`'s environment (tests/support/hub_cache.py) and working directory `cwd`."""
    architecture = TargetArchitecture.from_dir(target)
    work.mkdir(parents=True, exist_ok=True)
    (work / "prompts.json").write_text(json.dumps(prompts))
    alone = alone or {}
    outs = {name: work / f"{name}.json" for name in [*drafters, *alone]}
    runs = [{"out": str(outs[name]), "drafter": str(d) if d else None} for name, d in drafters.items()]
    runs += [{"out": str(outs[name]), "drafter": None, "alone": str(path)} for name, path in alone.items()]
    command = [
        str(vllm_python()),
        str(REPO / "tests" / "vllm_drafter.py"),
        "--target",
        served_as or str(target),
        "--prompts",
        str(work / "prompts.json"),
        "--runs",
        json.dumps(runs),
        "--max-tokens",
        str(max_tokens),
        "--num-speculative-tokens",
        str(num_steps),
    ]
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "2", **(node or {})}
    if architecture.uses_mla:
        command.append("--mla")
        env["EAGLEPIPE_TEST_CPU_ATTN_BLOCK16"] = "1"  # a drafter beside CPU MLA: tests/vllm_cpu_block16
    if architecture.text_only:
        command.append("--language-model-only")
    # One stream, so that each run's marker stands where vLLM's log lines of that run begin.
    run = subprocess.run(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=900, env=env, cwd=cwd
    )
    assert run.returncode == 0, run.stdout[-4000:]
    logs = dict.fromkeys(outs, "")
    current = None
    for line in run.stdout.splitlines(keepends=True):
        if line.startswith(MARK):
            current = next(name for name, out in outs.items() if str(out) == line[len(MARK) :].strip())
        elif current is not None:
            logs[current] += line
    return {name: (json.loads(outs[name].read_text()), logs[name]) for name in outs}
