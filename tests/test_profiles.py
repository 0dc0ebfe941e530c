"""The cluster profiles as Snakemake and its executor plugins read them, without a cluster.

profiles/slurm runs for real in tests/test_slurm.py. profiles/kubernetes cannot here: its dry run checks
that every key is an option Snakemake and the Kubernetes and fs-storage plugins accept, that every input
resolves through the storage layout it describes, and what each job asks for; no pod, image, volume or
GPU is involved.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import yaml
from tiny_run import (
    PROMPTS,
    REPO,
    RESULTS_ROOT,
    TINY_FULL_PLAN,
    planned_jobs,
    snakemake_command,
    tiny_config,
    write_prompts,
)

GPU_RULES = ("hidden", "train_drafter", "evaluate_drafter")


def profile(name: str) -> dict:
    return yaml.safe_load((REPO / "profiles" / name / "config.yaml").read_text())


def dry_run(workdir: Path, *args: str) -> subprocess.CompletedProcess:
    command = snakemake_command(workdir, "-n", *args)
    return subprocess.run(command, capture_output=True, text=True, timeout=300)


def job_resources(run: subprocess.CompletedProcess, rule: str) -> list[dict[str, str]]:
    """The `resources:` line of every planned job of `rule`, as {name: value}."""
    blocks = re.findall(rf"^(?:local)?rule {rule}:\n(.*?)(?=^\S|\Z)", run.stdout + run.stderr, re.M | re.S)
    lines = [re.search(r"^\s+resources: (.*)$", block, re.M)[1] for block in blocks]
    return [dict(item.split("=", 1) for item in line.split(", ")) for line in lines]


def test_profiles_ask_what_the_issue_and_the_plugins_require():
    slurm, kubernetes = profile("slurm"), profile("kubernetes")
    assert slurm["executor"] == "slurm" and kubernetes["executor"] == "kubernetes"
    for settings in (slurm, kubernetes):
        assert settings["jobs"] >= 1 and settings["latency-wait"] >= 5 and settings["retries"] >= 1
        # No `tasks`: each GPU job is one process over its node's GPUs (Slurm would start one per task).
        assert all("tasks" not in resources for resources in settings.get("set-resources", {}).values())
    assert {
        rule: kubernetes["set-resources"][rule]["gpu_manufacturer"] for rule in GPU_RULES
    } == dict.fromkeys(GPU_RULES, "nvidia")
    # The results root is a persistent volume in every pod: journal, ledger and shards outlive them.
    assert "eaglepipe-results:/workdir/results" in kubernetes["kubernetes-persistent-volumes"]
    assert kubernetes["default-storage-prefix"] == "/workdir"
    # The key stays on the submitting host: nothing is copied into the pods' Secret.
    assert "envvars" not in kubernetes


def test_no_profile_reruns_finished_work_for_an_edited_adapter_script():
    """Snakemake's `code` trigger hashes only the scripts/ adapter: every profile leaves it out, so an
    upgrade never silently reruns what depends on paid answers (README, "Rerunning")."""
    for path in sorted((REPO / "profiles").glob("*/config.yaml")):
        triggers = yaml.safe_load(path.read_text()).get("rerun-triggers")
        assert triggers and "code" not in triggers and {"mtime", "params", "input"} <= set(triggers), path


@pytest.mark.slow
@pytest.mark.cluster
def test_the_real_config_through_the_slurm_profile_asks_gpus_memory_and_runtime_per_rule(tmp_path: Path):
    config = tmp_path / "gpu-model.yaml"
    config.write_text(yaml.safe_dump({"cluster": {"gpu_model": "h100", "hidden": {"mem_mb": 1_500_000}}}))
    run = dry_run(
        REPO,
        "--workflow-profile",
        str(REPO / "profiles" / "slurm"),
        "--configfile",
        str(REPO / "config.yaml"),
        str(config),
    )
    assert run.returncode == 0, run.stderr[-3000:]
    hidden = job_resources(run, "hidden")
    assert len(hidden) == 8
    assert {(r["gpu"], r["gpu_model"], r["mem_mb"], r["runtime"]) for r in hidden} == {
        ("8", "h100", "1500000", "1440")
    }
    (train,) = job_resources(run, "train_drafter")
    assert (train["gpu"], train["gpu_model"], train["runtime"]) == ("8", "h100", "2880")
    # Rules without GPUs never ask a GPU type.
    assert all("gpu_model" not in r for r in job_resources(run, "tokens"))


@pytest.mark.slow
@pytest.mark.cluster
def test_the_kubernetes_profile_plans_a_run_through_its_storage_layout(model_dir: Path, tmp_path: Path):
    (tmp_path / "sources").mkdir()
    for ds, texts in PROMPTS.items():
        write_prompts(tmp_path, ds, texts)
    config = tiny_config(model_dir)
    config["hidden"]["gpus"] = 8
    (tmp_path / "tiny.yaml").write_text(yaml.safe_dump(config))
    # The working directory stands for /workdir on the submitting host, the storage prefix with it.
    run = dry_run(
        tmp_path,
        "--workflow-profile",
        str(REPO / "profiles" / "kubernetes"),
        "--default-storage-prefix",
        str(tmp_path),
        "--configfile",
        str(tmp_path / "tiny.yaml"),
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert planned_jobs(run) == TINY_FULL_PLAN
    assert {(r["gpu"], r["gpu_manufacturer"]) for r in job_resources(run, "hidden")} == {("8", "nvidia")}
    text = run.stdout + run.stderr
    assert f"{tmp_path}/{RESULTS_ROOT}/tiny-a/hidden.done (send to storage)" in text
