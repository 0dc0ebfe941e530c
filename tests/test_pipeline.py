"""The whole DAG through Snakemake itself, on a tiny config: real emulator, real model, real training.

One module-scoped run is shared by the checks: what it leaves, that a rerun has nothing to do, that an
edited prompt file reruns only its own chain plus the drafter, and that refreshing providers.json alone
reruns nothing.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parent.parent

PROMPTS = {
    "tiny-a": ["Name a colour.", "What is 3 plus 4?", "Say hi.", "Name a fruit."],
    "tiny-b": ["Write a haiku about rain.", "What is the capital of Italy?", "Count to three.",
               "Give me a word that rhymes with cat."],
}


def tiny_config(workdir: Path, model_dir: Path) -> dict:
    return {
        "datasets": list(PROMPTS),
        "sources": {ds: {"type": "jsonl", "path": f"sources/{ds}.jsonl"} for ds in PROMPTS},
        "target": {"name": "HuggingFaceTB/SmolLM2-135M-Instruct", "path": str(model_dir), "embedded": False},
        "api": {"base_url": "local", "model": "local/smollm2-135m-instruct"},
        "generation": {"concurrency": 8, "max_tokens": 12, "temperature": 0.0, "top_p": 1.0,
                       "return_token_ids": True},
        "budget": {"usd": 1.0, "output_tokens_per_dataset": 10_000},
        "hidden": {"dtype": "float32", "device": "cpu", "gpus": 0, "batch_tokens": 2048},
        "drafter": {"draft_vocab_size": 512, "ttt_length": 2, "lr": 1e-3, "epochs": 1, "max_steps": 4,
                    "batch_tokens": 1024, "max_seq_len": 256, "dtype": "float32", "device": "cpu", "gpus": 0},
        "eval": {"holdout_per_dataset": 1, "max_new_tokens": 8, "device": "cpu", "dtype": "float32"},
    }


def snakemake(workdir: Path, *args: str, timeout: int = 900) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile"), "--directory", str(workdir),
               "--configfile", str(workdir / "tiny.yaml"), "--cores", "2", "--resources", "api=1", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout)


def planned_jobs(run: subprocess.CompletedProcess) -> dict[str, int]:
    """The 'Job stats' table of a dry run, as {rule: count}."""
    if "Nothing to be done" in run.stdout + run.stderr:
        return {}
    table = (run.stdout + run.stderr).split("Job stats:")[1].split("\n\n")[0]
    return {m[1]: int(m[2]) for m in re.finditer(r"^(\w+)\s+(\d+)$", table, re.M) if m[1] != "total"}


def write_prompts(workdir: Path, ds: str, texts: list[str]) -> None:
    lines = [json.dumps({"messages": [{"role": "user", "content": t}]}) + "\n" for t in texts]
    (workdir / "sources" / f"{ds}.jsonl").write_text("".join(lines))


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory, model_dir):
    workdir = tmp_path_factory.mktemp("pipeline")
    (workdir / "sources").mkdir()
    for ds, texts in PROMPTS.items():
        write_prompts(workdir, ds, texts)
    (workdir / "tiny.yaml").write_text(yaml.safe_dump(tiny_config(workdir, model_dir)))
    run = snakemake(workdir)
    assert run.returncode == 0, run.stderr[-4000:]
    return workdir


def test_every_artifact_exists(pipeline):
    for ds in PROMPTS:
        for name in ("responses.jsonl", "responses.summary.json", "tokens.safetensors", "tokens.json",
                     "hidden.done"):
            assert (pipeline / "results" / ds / name).is_file(), f"{ds}/{name}"
        manifest = json.loads((pipeline / "results" / ds / "hidden.done").read_text())
        assert manifest["num_samples"] == len(PROMPTS[ds])
        assert all((pipeline / "results" / ds / s["path"]).is_file() for s in manifest["shards"])
    for name in ("config.json", "model.safetensors", "train.json", "eval.json"):
        assert (pipeline / "results" / "drafter" / name).is_file()
    assert json.loads((pipeline / "results" / "drafter" / "config.json").read_text())["architectures"] == [
        "LlamaForCausalLMEagle3"
    ]


def test_responses_carry_usage_and_token_ids(pipeline):
    lines = (pipeline / "results" / "tiny-a" / "responses.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    assert len(records) == 4
    for record in records:
        assert record["usage"]["completion_tokens"] >= 1 and record["usage"]["cost"] > 0
        assert record["provider"] and record["response"]["token_ids"]
    stats = json.loads((pipeline / "results" / "tiny-a" / "tokens.json").read_text())
    assert stats["billed"]["relative_difference"] == 0


def test_evaluation_uses_held_out_prompts_only(pipeline):
    train = json.loads((pipeline / "results" / "drafter" / "train.json").read_text())
    evaluation = json.loads((pipeline / "results" / "drafter" / "eval.json").read_text())
    assert len(train["holdout_ids"]) == 2
    assert sorted(evaluation["prompt_ids"]) == sorted(train["holdout_ids"])
    # Speculation must not change the output: every method emits the target's own greedy tokens.
    assert evaluation["outputs_identical_across_methods"] is True
    methods = evaluation["methods"]
    assert len({methods[m]["tokens"] for m in ("eagle3", "eagle3_untrained", "prompt_lookup")}) == 1
    for method in methods.values():
        assert method["acceptance_length"] == round(method["tokens"] / method["target_forwards"], 4)


def test_rerun_has_nothing_to_do(pipeline):
    run = snakemake(pipeline, "-n")
    assert run.returncode == 0 and planned_jobs(run) == {}, run.stdout[-2000:]


def test_refreshing_providers_reruns_nothing_else(pipeline):
    run = snakemake(pipeline, "--forcerun", "providers", "--until", "providers")
    assert run.returncode == 0, run.stderr[-2000:]
    assert planned_jobs(snakemake(pipeline, "-n")) == {}


def test_editing_one_prompt_file_reruns_only_its_chain(pipeline):
    write_prompts(pipeline, "tiny-b", [*PROMPTS["tiny-b"][:3], "Name an animal."])
    jobs = planned_jobs(snakemake(pipeline, "-n"))
    assert jobs == {"prompts": 1, "generate": 1, "tokens": 1, "hidden": 1, "train_drafter": 1,
                    "evaluate_drafter": 1, "all": 1}
