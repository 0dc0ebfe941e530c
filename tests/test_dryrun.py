"""Planning the real run needs no key, no network and no GPU; running it without a key stops at once."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def snakemake(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "OPENROUTER_KEY_FILE"}
    env["HF_HUB_OFFLINE"] = "1"
    command = [sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile"), "--directory", str(tmp_path),
               "--configfile", str(REPO / "config.yaml"), *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=300, env=env)


def job_counts(output: str) -> dict[str, int]:
    table = output.split("Job stats:")[1].split("\n\n")[0]
    return {m[1]: int(m[2]) for m in re.finditer(r"^(\w+)\s+(\d+)$", table, re.M) if m[1] != "total"}


def test_dry_run_plans_the_real_run_without_a_key(tmp_path):
    run = snakemake(tmp_path, "-n")
    assert run.returncode == 0, run.stderr[-2000:]
    assert job_counts(run.stdout) == {
        "prompts": 8, "providers": 1, "generation_settings": 1, "generate": 8, "tokens": 8, "hidden": 8,
        "train_drafter": 1, "describe_drafter": 1, "evaluate_drafter": 1, "figures": 1, "all": 1,
    }
    assert "resources/prompts/B5.jsonl" in run.stdout and not (tmp_path / "results").exists()


@pytest.mark.slow
def test_one_sets_hidden_states_plan_only_that_chain(tmp_path):
    run = snakemake(tmp_path, "-n", "results/B5/hidden.done")
    assert run.returncode == 0, run.stderr[-2000:]
    assert job_counts(run.stdout) == {"prompts": 1, "providers": 1, "generation_settings": 1, "generate": 1,
                                      "tokens": 1, "hidden": 1}
    assert not re.search(r"B[1-46-8]\b", run.stdout)


@pytest.mark.slow
def test_a_real_run_without_a_key_stops_before_any_job(tmp_path):
    run = snakemake(tmp_path, "--cores", "1", "results/B5/responses.jsonl")
    assert run.returncode != 0
    assert "eaglepipe: no API key file" in run.stderr
    assert "rule prompts" not in run.stdout + run.stderr and not (tmp_path / "resources").exists()


def test_a_dry_run_ends_with_the_plan_and_says_the_key_is_missing(tmp_path):
    """The plan is the last thing a dry run prints (after Snakemake's job list), closed by its one
    sentence, and a missing key file, which would stop the real run before buying, is said there."""
    env = {k: v for k, v in os.environ.items() if k != "OPENROUTER_KEY_FILE"}
    command = [sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile"), "--directory", str(tmp_path),
               "--configfile", str(REPO / "config.yaml"), "-n"]
    run = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300,
                         env=env)
    assert run.returncode == 0, run.stdout[-2000:]
    lines = [line for line in run.stdout.splitlines() if line.strip()]
    assert lines[-1].startswith("In short: ") and "Job stats:" in run.stdout
    assert lines[-2].startswith("warning: no API key file")
    assert run.stdout.index("Job stats:") < run.stdout.index("eaglepipe spend plan")


def test_a_configfile_cannot_silently_replace_the_demo_profiles_own(tmp_path):
    """`--workflow-profile profiles/local --configfile my.yaml` would drop config/local.yaml and run the real
    run's config (OpenRouter, its budget, results/): refused in one line that gives the form that works."""
    (tmp_path / "my.yaml").write_text("budget: {usd: 0.5}\n")
    shutil.copy(REPO / "config.yaml", tmp_path)  # the Snakefile's own config file, read in its directory
    (tmp_path / "resources").symlink_to(REPO / "resources")  # the demo's prompt sources
    base = [sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile"), "--directory", str(tmp_path),
            "--workflow-profile", str(REPO / "profiles" / "local"), "-n"]
    run = subprocess.run([*base, "--configfile", str(tmp_path / "my.yaml")], capture_output=True, text=True,
                         timeout=300, cwd=REPO)
    assert run.returncode != 0
    (line,) = [line for line in run.stderr.splitlines() if line.startswith("eaglepipe:")]
    assert "replaced the config files of" in line and f"--configfile config/local.yaml {tmp_path}" in line
    both = subprocess.run([*base, "--configfile", "config/local.yaml", str(tmp_path / "my.yaml")],
                          capture_output=True, text=True, timeout=300, cwd=REPO)
    assert both.returncode == 0, both.stderr[-2000:]
