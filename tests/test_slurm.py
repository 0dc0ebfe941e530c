"""The pipeline on a real Slurm: Debian's slurmctld, slurmd and munge started on 127.0.0.1 by the tests
(tests/slurm_cluster.py), driven by snakemake-executor-plugin-slurm through profiles/slurm as a cluster
user runs it.

A run through the scheduler must equal a local one; a hidden job cancelled with scancel must be finished
by the profile's retry from the shards it completed; killing the submitting Snakemake during generation
must lose nothing paid. Needs root (apt-get, daemons): CI runs it; `EAGLEPIPE_SKIP_SLURM=1` or
`-m "not slurm"` skips it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import yaml
from budget import shared_budget
from safetensors.torch import load_file
from slurm_cluster import GPU_MODEL, Slurm, running_slurm
from test_generation_rehearsal import processes_in_group, rig
from tiny_run import (
    PROMPTS,
    REPO,
    RESULTS_ROOT,
    TINY_FULL_PLAN,
    planned_jobs,
    snakemake,
    snakemake_command,
    tiny_config,
    write_prompts,
)

pytestmark = [
    pytest.mark.slurm,
    pytest.mark.cluster,
    pytest.mark.slow,
    pytest.mark.budget(300, reason="a whole tiny run (or most of one) through a real Slurm: 55-80 s each"),
    pytest.mark.skipif(os.environ.get("EAGLEPIPE_SKIP_SLURM") == "1", reason="EAGLEPIPE_SKIP_SLURM=1"),
    pytest.mark.skipif(os.geteuid() != 0, reason="installs and starts Slurm: needs root"),
]

# profiles/slurm as shipped, plus what this cluster needs: no accounting (so squeue, not sacct, and no
# account), a first status check after 1 s instead of 40, and every job's Slurm log kept for the checks.
SLURM_OPTIONS = [
    "--workflow-profile",
    str(REPO / "profiles" / "slurm"),
    "--slurm-status-command",
    "squeue",
    "--slurm-no-account",
    "--slurm-init-seconds-before-status-checks",
    "1",
    "--slurm-keep-successful-logs",
    "--latency-wait",
    "5",
]
# Jobs that fit the one 2-CPU node; threads as the local tiny run has them.
SMALL_JOBS = {
    "tokens": {"cpus": 1, "mem_mb": 2000, "runtime_min": 30},
    "hidden": {"cpus": 2, "mem_mb": 3000, "runtime_min": 30},
    "train_drafter": {"cpus": 2, "mem_mb": 3000, "runtime_min": 30},
    "evaluate_drafter": {"cpus": 2, "mem_mb": 3000, "runtime_min": 30},
}


@pytest.fixture(scope="module")
@shared_budget(600, reason="on a fresh machine, installs Slurm and munge with apt-get first")
def slurm(tmp_path_factory) -> Iterator[Slurm]:
    with running_slurm(tmp_path_factory.mktemp("slurm")) as cluster:
        yield cluster


def slurm_logs(workdir: Path, rule: str) -> list[Path]:
    """The Slurm log of every job the plugin submitted for `rule`, oldest first."""
    logs = (workdir / ".snakemake" / "slurm_logs" / f"rule_{rule}").rglob("*.log")
    return sorted(logs, key=lambda path: int(path.stem))


def submitted_by_rule(workdir: Path) -> dict[str, int]:
    folder = workdir / ".snakemake" / "slurm_logs"
    rules = [path.name.removeprefix("rule_") for path in folder.glob("rule_*")] if folder.is_dir() else []
    return {rule: len(slurm_logs(workdir, rule)) for rule in rules}


def answers(responses: Path) -> dict[str, tuple[str, list[int]]]:
    records = [json.loads(line) for line in responses.read_text().splitlines()]
    return {r["prompt_id"]: (r["response"]["content"], r["response"]["token_ids"]) for r in records}


def hidden_states(root: Path, ds: str) -> dict[str, torch.Tensor]:
    """Every shard of a set, concatenated in manifest order."""
    manifest = json.loads((root / ds / "hidden.done").read_text())
    shards = [load_file(str(root / ds / entry["path"])) for entry in manifest["shards"]]
    return {name: torch.cat([shard[name] for shard in shards]) for name in ("aux", "final", "input_ids")}


def write_config(workdir: Path, config: dict) -> None:
    (workdir / "tiny.yaml").write_text(yaml.safe_dump(config))


def test_a_run_through_slurm_equals_the_local_run(
    slurm: Slurm, tiny_pipeline: Path, model_dir: Path, tmp_path: Path
) -> None:
    (tmp_path / "sources").mkdir()
    for ds, texts in PROMPTS.items():
        write_prompts(tmp_path, ds, texts)
    config = tiny_config(model_dir)
    # GPUs as a real run asks them; the node's are stand-ins (tests/slurm_cluster.py), the stages use the CPU.
    config["hidden"]["gpus"], config["drafter"]["gpus"] = 2, 1
    config["cluster"] = {"gpu_model": GPU_MODEL, **SMALL_JOBS}
    write_config(tmp_path, config)

    started = time.monotonic()
    run = snakemake(tmp_path, *SLURM_OPTIONS, env=slurm.env)
    assert run.returncode == 0, run.stderr[-4000:] + slurm.log_tail()
    jobs = planned_jobs(run)
    print(f"Slurm run: {time.monotonic() - started:.0f} s, jobs {jobs}")
    assert jobs == TINY_FULL_PLAN
    # Each compute job went through sbatch; prompts, providers and generate ran on the submit host.
    assert submitted_by_rule(tmp_path) == {
        "tokens": 2,
        "hidden": 2,
        "train_drafter": 1,
        "evaluate_drafter": 1,
    }

    # What Slurm was asked for, as it recorded it: the plugin's --gpus=MODEL:N, nothing for the CPU stage.
    asked = {
        rule: {slurm.job_fields(log.stem).get("TresPerJob") for log in slurm_logs(tmp_path, rule)}
        for rule in ("tokens", "hidden", "train_drafter", "evaluate_drafter")
    }
    assert asked == {
        "tokens": {None},
        "hidden": {f"gres:gpu:{GPU_MODEL}:2"},
        "train_drafter": {f"gres:gpu:{GPU_MODEL}:1"},
        "evaluate_drafter": {f"gres:gpu:{GPU_MODEL}:1"},
    }

    local, cluster = tiny_pipeline / RESULTS_ROOT, tmp_path / RESULTS_ROOT
    for ds in PROMPTS:
        assert answers(cluster / ds / "responses.jsonl") == answers(local / ds / "responses.jsonl")
        ours, theirs = (
            load_file(str(cluster / ds / "tokens.safetensors")),
            load_file(str(local / ds / "tokens.safetensors")),
        )
        assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)
        ours, theirs = hidden_states(cluster, ds), hidden_states(local, ds)
        assert torch.equal(ours["input_ids"], theirs["input_ids"])
        assert torch.allclose(ours["aux"], theirs["aux"], atol=1e-4)
        assert torch.allclose(ours["final"], theirs["final"], atol=1e-4)
    drafter, local_drafter = cluster / "drafter", local / "drafter"
    assert json.loads((drafter / "config.json").read_text()) == json.loads(
        (local_drafter / "config.json").read_text()
    )
    weights, local_weights = (
        load_file(str(drafter / "model.safetensors")),
        load_file(str(local_drafter / "model.safetensors")),
    )
    assert {k: v.shape for k, v in weights.items()} == {k: v.shape for k, v in local_weights.items()}
    evaluation = json.loads((drafter / "eval.json").read_text())
    assert (
        evaluation["methods"].keys()
        == json.loads((local_drafter / "eval.json").read_text())["methods"].keys()
    )
    assert evaluation["methods"]["eagle3"]["tokens"] > 0


def tiny_command(workdir: Path, *args: str) -> list[str]:
    return snakemake_command(
        workdir, "--configfile", str(workdir / "tiny.yaml"), "--cores", "2", "--resources", "api=1", *args
    )


def test_a_hidden_job_cancelled_by_scancel_is_retried_from_its_finished_shards(
    slurm: Slurm, model_dir: Path, tmp_path: Path
) -> None:
    samples = 32  # one shard per sample (shard_tokens 1): the job is cancelled long before the last
    (tmp_path / "sources").mkdir()
    write_prompts(tmp_path, "many", [f"Say the number {i}." for i in range(samples)])
    config = tiny_config(model_dir)
    config.update(
        datasets=["many"],
        sources={"many": {"type": "jsonl", "path": "sources/many.jsonl"}},
        cluster=SMALL_JOBS,
    )
    config["generation"].update(max_tokens=4, concurrency=16)
    config["hidden"]["shard_tokens"] = 1
    write_config(tmp_path, config)
    results = tmp_path / RESULTS_ROOT / "many"
    tokens = snakemake(tmp_path, *SLURM_OPTIONS, f"{RESULTS_ROOT}/many/tokens.json", env=slurm.env)
    assert tokens.returncode == 0, tokens.stderr[-4000:] + slurm.log_tail()

    process = subprocess.Popen(
        tiny_command(tmp_path, *SLURM_OPTIONS, f"{RESULTS_ROOT}/many/hidden.done"),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=slurm.env,
    )
    try:
        deadline = time.monotonic() + 600
        running: list[dict[str, str]] = []
        while not running:  # the hidden job is submitted once the tokens are there
            assert process.poll() is None, "snakemake ended before the hidden job ran"
            assert time.monotonic() < deadline, f"no hidden job running within 600 s: {slurm.jobs()}"
            running = [
                job for job in slurm.jobs() if "rule_hidden" in job["comment"] and job["state"] == "RUNNING"
            ]
            time.sleep(0.2)
        while not any(results.glob("hidden/shard-*.json")):  # cancelled right after its first finished shard
            assert process.poll() is None and time.monotonic() < deadline, "the hidden job wrote no shard"
            time.sleep(0.01)
        cancelled = running[0]["id"]
        slurm.command("scancel", cancelled)
        while any(job["id"] == cancelled for job in slurm.jobs()):
            time.sleep(0.1)
        # Finished shards are those with their checksummed record beside them.
        finished = [record.with_suffix(".safetensors") for record in results.glob("hidden/shard-*.json")]
        kept = {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in finished}
        assert process.wait(timeout=600) == 0, slurm.log_tail()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()

    assert 0 < len(kept) < samples
    first, retry = slurm_logs(tmp_path, "hidden")
    assert first.stem == cancelled
    # The profile's retry reused every shard the cancelled job finished, untouched, and computed the rest.
    retry_log = retry.read_text()
    assert f"{len(kept)} of {samples} shards already written and verified" in retry_log
    assert retry_log.count("samples,") == samples - len(kept)
    after = {name: (results / "hidden" / name).stat() for name in kept}
    assert {name: (stat.st_ino, stat.st_mtime_ns) for name, stat in after.items()} == kept
    assert len(json.loads((results / "hidden.done").read_text())["shards"]) == samples
    print(
        f"scancel: {len(kept)} of {samples} shards finished before the cancel, reused by the retry; "
        f"{samples - len(kept)} computed by it"
    )


def test_killing_the_submitting_snakemake_during_generation_buys_nothing_twice(
    slurm: Slurm, tmp_path: Path
) -> None:
    prompts = 600
    emulator = [
        "--tokens-per-s",
        "10",
        "--latency-s",
        "2.0",
        "--mean-tokens",
        "40",
        "--tokens-per-event",
        "8",
    ]
    with rig(tmp_path, *emulator) as run:
        run.configure(
            {"kill": prompts},
            generation={"concurrency": 200, "max_tokens": 200},
            budget={"usd": 100, "output_tokens_per_dataset": 10_000_000},
        )
        process = subprocess.Popen(
            run.command(*SLURM_OPTIONS),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=run.env,
            start_new_session=True,
        )
        deadline = time.monotonic() + 120
        while True:
            assert process.poll() is None, "snakemake ended before the kill"
            assert time.monotonic() < deadline, f"never 100 answers with 100 in flight: {run.stats()}"
            if run.stats()["in_flight"] >= 100 and len(run.journal("kill")) >= 100:
                break
            time.sleep(0.2)
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        time.sleep(1.0)
        at_kill = run.stats()
        journaled = len(run.journal("kill"))
        assert 0 < journaled < prompts
        assert processes_in_group(process.pid) == []

        assert run.snakemake("--unlock", *SLURM_OPTIONS).returncode == 0
        rerun = run.snakemake(*SLURM_OPTIONS)
        assert rerun.returncode == 0, rerun.stderr[-3000:]

        ids = [record["prompt_id"] for record in run.responses("kill")]
        assert len(ids) == len(set(ids)) == prompts
        final = run.stats()
        in_flight_at_kill = at_kill["requests_received"] - journaled
        assert final["requests_billed"] <= prompts + in_flight_at_kill
        assert final["requests_received"] - at_kill["requests_received"] == prompts - journaled
        summary = run.summary("kill")
        assert summary["resumed"] == journaled and summary["recovered"] > 0
        # Answers in flight at the kill were charged but never received: bought again, and in the ledger.
        assert run.ledger_usd() == pytest.approx(final["usd_charged"], rel=0.02)
        # Generation is a localrule: it ran in the submitting process, and nothing went to Slurm.
        assert submitted_by_rule(run.workdir) == {}
        print(
            f"kill: {journaled} of {prompts} answers journaled at the kill, {in_flight_at_kill} in flight; "
            f"rerun sent {prompts - journaled}, billed {final['requests_billed']} in all"
        )
