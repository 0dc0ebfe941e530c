"""The tiny end-to-end configuration that tests run the real DAG on through Snakemake itself.

It is the embedded default made small: the same real model and emulator, two sets of four prompts, and
its own results root (results/demo, as config/local.yaml), so a test can put the real config beside it.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
RESULTS_ROOT = "results/demo"

PROMPTS = {
    "tiny-a": ["Name a colour.", "What is 3 plus 4?", "Say hi.", "Name a fruit."],
    "tiny-b": ["Write a haiku about rain.", "What is the capital of Italy?", "Count to three.",
               "Give me a word that rhymes with cat."],
}


# The jobs a full run of the tiny config plans, however it is executed (locally, on Slurm, on Kubernetes).
TINY_FULL_PLAN = {"prompts": 2, "providers": 1, "generation_settings": 1, "generate": 2, "tokens": 2,
                  "hidden": 2, "train_drafter": 1, "describe_drafter": 1, "evaluate_drafter": 1, "figures": 1,
                  "all": 1}


def tiny_config(model_dir: Path) -> dict:
    return {
        "paths": {"results": RESULTS_ROOT, "prompts": f"{RESULTS_ROOT}/prompts"},
        "datasets": list(PROMPTS),
        "sources": {ds: {"type": "jsonl", "path": f"sources/{ds}.jsonl"} for ds in PROMPTS},
        "target": {"name": "HuggingFaceTB/SmolLM2-135M-Instruct", "path": str(model_dir), "embedded": False},
        "api": {"base_url": "local", "model": "local/smollm2-135m-instruct"},
        "generation": {"concurrency": 8, "max_tokens": 12, "temperature": 0.0, "top_p": 1.0,
                       "return_token_ids": True},
        "budget": {"usd": 1.0, "output_tokens_per_dataset": 10_000},
        # The shards are kilobytes: the real run's 10 GB margin would make the suite fail on a CI disk with
        # less free (stop 42's CI had 3.7 GB), which is the machine's state, not the code's.
        "hidden": {"dtype": "float32", "device": "cpu", "gpus": 0, "batch_tokens": 2048, "keep_free_gb": 0},
        "drafter": {"draft_vocab_size": 512, "ttt_length": 2, "lr": 1e-3, "epochs": 1, "max_steps": 4,
                    "batch_tokens": 1024, "max_seq_len": 256, "dtype": "float32", "device": "cpu", "gpus": 0},
        "eval": {"holdout_per_dataset": 1, "max_new_tokens": 8, "device": "cpu", "dtype": "float32"},
    }


def snakemake_command(workdir: Path, *args: str) -> list[str]:
    """The command line every test runs Snakemake with: this checkout's Snakefile on `workdir`."""
    return [sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile"), "--directory", str(workdir),
            *args]


def snakemake(workdir: Path, *args: str, configfile: Path | None = None, timeout: int = 900,
              env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Snakemake on `workdir` with the tiny config (or `configfile`)."""
    config = configfile or workdir / "tiny.yaml"
    command = snakemake_command(workdir, "--configfile", str(config), "--cores", "2", "--resources", "api=1",
                                *args)
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env)


def planned_jobs(run: subprocess.CompletedProcess) -> dict[str, int]:
    """The 'Job stats' table of a dry run, as {rule: count}."""
    if "Nothing to be done" in run.stdout + run.stderr:
        return {}
    table = (run.stdout + run.stderr).split("Job stats:")[1].split("\n\n")[0]
    return {m[1]: int(m[2]) for m in re.finditer(r"^(\w+)\s+(\d+)$", table, re.M) if m[1] != "total"}


def write_prompts(workdir: Path, ds: str, texts: list[str]) -> None:
    lines = [json.dumps({"messages": [{"role": "user", "content": t}]}) + "\n" for t in texts]
    (workdir / "sources" / f"{ds}.jsonl").write_text("".join(lines))


def build_tiny_run(workdir: Path, model_dir: Path) -> Path:
    """Run the whole tiny DAG in `workdir`; returns its results root."""
    (workdir / "sources").mkdir()
    for ds, texts in PROMPTS.items():
        write_prompts(workdir, ds, texts)
    (workdir / "tiny.yaml").write_text(yaml.safe_dump(tiny_config(model_dir)))
    run = snakemake(workdir)
    assert run.returncode == 0, run.stderr[-4000:]
    return workdir / RESULTS_ROOT
