"""The paid stage rehearsed end to end: Snakemake runs the generate rule against a standalone synthetic
emulator (OpenRouter's API on loopback, no model) with a key, faults, credit limits and kills.

Every figure asserted comes from the emulator's own counters over HTTP (`/emulator/stats`), so "nothing
bought twice" and "the ledger equals what was charged" are checked against the server, not our client.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from support.emulator import running_emulator
from tiny_run import snakemake_command

from eaglepipe.openrouter.journal import read_records
from eaglepipe.openrouter.ledger import read_ledger

pytestmark = pytest.mark.slow

MODEL = "moonshotai/kimi-k2.5"
SECRET = "sk-or-v1-REHEARSALSECRET00112233445566778899"
ALLOWED = {"Chutes", "Moonshot AI"}  # the emulator's native-INT4 endpoints that the default routing keeps


class Rig:
    """A work directory with prompt sets, a key file and a config aimed at one emulator."""

    def __init__(self, workdir: Path, url: str, key_file: Path) -> None:
        self.workdir, self.url, self.key_file = workdir, url, key_file
        self.env = {**os.environ, "OPENROUTER_KEY_FILE": str(key_file), "HF_HUB_OFFLINE": "1"}

    def configure(self, sets: dict[str, int], **sections: dict[str, Any]) -> None:
        (self.workdir / "sources").mkdir(exist_ok=True)
        for name, count in sets.items():
            lines = [
                json.dumps(
                    {"messages": [{"role": "user", "content": f"{name} question {i}: say something."}]}
                )
                for i in range(count)
            ]
            (self.workdir / "sources" / f"{name}.jsonl").write_text("\n".join(lines) + "\n")
        config = {
            "datasets": list(sets),
            "sources": {name: {"type": "jsonl", "path": f"sources/{name}.jsonl"} for name in sets},
            "target": {"name": "rehearsal", "path": str(self.workdir / "no-model")},
            "api": {"base_url": self.url, "model": MODEL},
            "generation": {"max_tokens": 2000, "stream": True, **sections.pop("generation", {})},
            **sections,
        }
        (self.workdir / "rig.yaml").write_text(yaml.safe_dump(config))
        self.targets = [f"results/{name}/responses.jsonl" for name in sets]

    def command(self, *args: str) -> list[str]:
        """Snakemake aimed at the sets' responses (generation only), with extra options `args`."""
        return snakemake_command(
            self.workdir,
            "--configfile",
            str(self.workdir / "rig.yaml"),
            "--cores",
            "2",
            *self.targets,
            *args,  # after the targets: options such as --resources take several values
        )

    def start(self, *, output: bool = False) -> subprocess.Popen:
        """Snakemake in its own process group, so that a test can kill the whole run at once; with
        `output`, its stdout and stderr as one text stream for `communicate`."""
        sink = subprocess.PIPE if output else subprocess.DEVNULL
        return subprocess.Popen(
            self.command(),
            stdout=sink,
            stderr=subprocess.STDOUT if output else subprocess.DEVNULL,
            text=True,
            env=self.env,
            start_new_session=True,
        )

    def snakemake(self, *args: str, timeout: int = 300) -> subprocess.CompletedProcess:
        return subprocess.run(
            self.command(*args), capture_output=True, text=True, timeout=timeout, env=self.env
        )

    def stats(self) -> dict[str, Any]:
        return httpx.get(f"{self.url}/emulator/stats").json()

    def responses(self, name: str) -> list[dict[str, Any]]:
        path = self.workdir / "results" / name / "responses.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines()]

    def journal(self, name: str) -> list[dict[str, Any]]:
        return read_records(self.workdir / "results" / name / ".journal")

    def summary(self, name: str) -> dict[str, Any]:
        return json.loads((self.workdir / "results" / name / "responses.summary.json").read_text())

    def ledger_usd(self) -> float:
        return read_ledger(self.workdir / "results" / ".ledger").usd

    def ledger_charges(self) -> dict[str, float]:
        """{generation id: dollars} of the ledger's billed lines."""
        lines = (self.workdir / "results" / ".ledger" / "ledger.jsonl").read_text().splitlines()
        entries = [json.loads(line) for line in lines]
        return {
            e["generation_id"]: e["usd"] for e in entries if e["event"] == "billed" and e["generation_id"]
        }

    def generation_charges(self, ids: dict[str, float]) -> dict[str, float]:
        """What `/generation` says each of these requests cost (0 where it knows none)."""
        charges = {}
        with httpx.Client(headers={"Authorization": f"Bearer {SECRET}"}) as http:
            for generation_id in ids:
                answer = http.get(f"{self.url}/generation", params={"id": generation_id})
                charges[generation_id] = (
                    answer.json()["data"]["total_cost"] if answer.status_code == 200 else 0.0
                )
        return charges


@contextmanager
def rig(tmp_path: Path, *emulator_args: str) -> Iterator[Rig]:
    key_file = tmp_path / "openrouter.key"
    key_file.write_text(SECRET + "\n")
    key_file.chmod(0o600)
    workdir = tmp_path / "work"
    workdir.mkdir()
    args = ["--model-id", MODEL, "--require-key-file", str(key_file), "--seed", "7", *emulator_args]
    with running_emulator(None, extra_args=args, log_path=tmp_path / "emulator.log") as url:
        yield Rig(workdir, url, key_file)


def files_containing(folder: Path, text: str) -> list[Path]:
    return [p for p in folder.rglob("*") if p.is_file() and text.encode() in p.read_bytes()]


def processes_in_group(group: int) -> list[str]:
    """Live (not zombie) processes of a process group, as "pid command"."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if fields[0] != "Z" and int(fields[2]) == group:
            found.append(f"{entry.name} {command[:200]}")
    return found


def test_sigkill_mid_run_then_rerun_buys_each_prompt_once(tmp_path: Path) -> None:
    prompts = 1500
    # Slow answers (2 s to the first token, 10 tok/s) keep 700 in flight at under 100 answers a second.
    with rig(
        tmp_path,
        "--tokens-per-s",
        "10",
        "--latency-s",
        "2.0",
        "--mean-tokens",
        "60",
        "--tokens-per-event",
        "8",
    ) as run:
        run.configure(
            {"kill": prompts},
            generation={"concurrency": 700, "max_tokens": 200},
            budget={"usd": 100, "output_tokens_per_dataset": 10_000_000},
        )
        process = run.start()
        deadline = time.monotonic() + 120
        while True:
            assert process.poll() is None, "snakemake ended before the kill"
            assert time.monotonic() < deadline, f"never reached 500 in flight: {run.stats()}"
            if run.stats()["in_flight"] >= 500 and run.journal("kill"):
                break
            time.sleep(0.2)
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        time.sleep(1.0)
        at_kill = run.stats()
        journaled = len(run.journal("kill"))
        in_flight_at_kill = at_kill["requests_received"] - journaled
        assert in_flight_at_kill >= 500 and 0 < journaled < prompts
        assert processes_in_group(process.pid) == [], "a process of the killed run is still alive"

        unlock = run.snakemake("--unlock")  # the README's documented rerun after a kill
        assert unlock.returncode == 0, unlock.stderr[-2000:]
        rerun = run.snakemake()
        assert rerun.returncode == 0, rerun.stderr[-3000:]

        ids = [record["prompt_id"] for record in run.responses("kill")]
        assert len(ids) == len(set(ids)) == prompts
        final = run.stats()
        assert final["requests_billed"] <= prompts + in_flight_at_kill
        assert final["requests_received"] - at_kill["requests_received"] == prompts - journaled
        summary = run.summary("kill")
        assert summary["resumed"] == journaled and summary["recovered"] > 0
        # Requests in flight at the kill were charged by the server; the ledger found them by generation id.
        assert run.ledger_usd() == pytest.approx(final["usd_charged"], rel=0.02)
        assert run.ledger_usd() <= final["usd_charged"] + 1e-9


def test_ctrl_c_ends_the_job_with_one_line_and_a_rerun_buys_only_the_rest(tmp_path: Path) -> None:
    """Ctrl-C as a terminal sends it, to the whole foreground process group: the job's own output ends with
    one line saying what it kept, no traceback; the same command then resumes without buying twice."""
    prompts = 200
    with rig(tmp_path, "--tokens-per-s", "10", "--latency-s", "1.0", "--mean-tokens", "40") as run:
        run.configure(
            {"ctrlc": prompts},
            generation={"concurrency": 50, "max_tokens": 200},
            budget={"usd": 100, "output_tokens_per_dataset": 10_000_000},
        )
        process = run.start(output=True)
        deadline = time.monotonic() + 120
        while len(run.journal("ctrlc")) < 10:
            assert process.poll() is None, "snakemake ended before the Ctrl-C"
            assert time.monotonic() < deadline, f"never journaled 10 answers: {run.stats()}"
            time.sleep(0.2)
        os.killpg(process.pid, signal.SIGINT)
        output, _ = process.communicate(timeout=120)
        at_stop, journaled = run.stats(), len(run.journal("ctrlc"))
        assert process.returncode != 0 and 0 < journaled < prompts

        job_output = output.split("localrule generate:")[1].split("RuleException")[0].strip().splitlines()
        assert job_output[-1].endswith(f"stopped: {journaled} answers kept, rerun the same command to resume")
        assert "Traceback" not in output and "KeyboardInterrupt" not in output
        assert "eaglepipe: job generate (ds=ctrlc) stopped by Ctrl-C: see" in output

        rerun = run.snakemake()
        assert rerun.returncode == 0, rerun.stderr[-3000:]
        assert len({record["prompt_id"] for record in run.responses("ctrlc")}) == prompts
        assert run.stats()["requests_received"] - at_stop["requests_received"] == prompts - journaled


def test_ctrl_c_as_a_set_writes_its_answers_then_the_same_command_goes_on(tmp_path: Path) -> None:
    """The moment a set's responses.jsonl is written and its job has not yet ended, Snakemake still marks
    the file incomplete: a Ctrl-C there used to make the same command refuse (IncompleteFilesException).
    The workflow's default profile (profiles/default, read by a plain `snakemake`) reruns such a job, and
    the rerun resumes from the journal: nothing bought again."""
    prompts = 300
    with rig(tmp_path, "--tokens-per-s", "400", "--latency-s", "0.05", "--mean-tokens", "20") as run:
        run.configure(
            {"written": prompts},
            generation={"concurrency": 100, "max_tokens": 60},
            budget={"usd": 100, "output_tokens_per_dataset": 10_000_000},
        )
        answers = run.workdir / "results" / "written" / "responses.jsonl"
        process = run.start(output=True)
        deadline = time.monotonic() + 120
        while not answers.exists():
            assert process.poll() is None, "snakemake ended before its answers were written"
            assert time.monotonic() < deadline, f"never wrote the answers: {run.stats()}"
            time.sleep(0.002)
        os.killpg(process.pid, signal.SIGINT)
        output, _ = process.communicate(timeout=120)
        marked = list((run.workdir / ".snakemake" / "incomplete").rglob("*"))
        assert process.returncode != 0 and marked, "the Ctrl-C missed the moment:\n" + output[-3000:]
        bought = run.stats()["requests_received"]

        rerun = run.snakemake()
        assert rerun.returncode == 0, rerun.stderr[-3000:]
        assert "IncompleteFilesException" not in rerun.stderr
        assert len({record["prompt_id"] for record in run.responses("written")}) == prompts
        assert run.stats()["requests_received"] == bought


def test_answers_cut_by_a_kill_are_journaled_from_stored_content_not_bought_again(tmp_path: Path) -> None:
    """The account stores content; the provider runs out every stream the kill cut and bills it. The
    rerun's start finds them in `/generation`, journals their stored text (`recovered_content`) and buys
    only the prompts that had no answer anywhere."""
    prompts = 240
    # 1 s to the first token, then about 2 s of tokens: 100 in flight at once.
    with rig(
        tmp_path, "--tokens-per-s", "20", "--latency-s", "1.0", "--mean-tokens", "40", "--store-content"
    ) as run:
        run.configure(
            {"stored": prompts},
            generation={"concurrency": 100, "max_tokens": 200},
            budget={"usd": 100, "output_tokens_per_dataset": 10_000_000},
        )
        process = run.start()
        deadline = time.monotonic() + 120
        while not (run.stats()["in_flight"] >= 80 and run.journal("stored")):
            assert process.poll() is None, "snakemake ended before the kill"
            assert time.monotonic() < deadline, f"never reached 80 in flight: {run.stats()}"
            time.sleep(0.1)
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        in_flight_at_kill = run.stats()["in_flight"]
        while run.stats()["in_flight"]:  # the provider runs the cut answers out
            assert time.monotonic() < deadline + 60, run.stats()
            time.sleep(0.2)
        at_kill = run.stats()
        journaled = len(run.journal("stored"))
        assert run.snakemake("--unlock").returncode == 0
        rerun = run.snakemake()
        assert rerun.returncode == 0, rerun.stderr[-3000:]

        records = run.responses("stored")
        assert len({record["prompt_id"] for record in records}) == len(records) == prompts
        rebuilt = [record for record in records if record.get("recovered_content")]
        outcomes = read_ledger(run.workdir / "results" / ".ledger").by_outcome
        assert len(rebuilt) == outcomes["recovered_content"] > 0
        assert all(record["response"]["finish_reason"] in ("stop", "length") for record in rebuilt)
        final = run.stats()
        # The rerun bought exactly the prompts that were neither journaled nor stored.
        assert final["requests_received"] - at_kill["requests_received"] == prompts - journaled - len(rebuilt)
        assert run.summary("stored")["resumed"] == journaled + len(rebuilt)
        # Each request the ledger knows is charged as the provider billed it. It misses only requests in
        # flight at the kill whose generation id it had not written yet: the provider bills them and
        # nothing tells the client of them (on OpenRouter as here).
        billed = run.ledger_charges()
        assert billed == pytest.approx(run.generation_charges(billed), rel=1e-9, abs=1e-12)
        assert 0 <= final["requests_billed"] - len(billed) <= in_flight_at_kill
        assert run.ledger_usd() <= final["usd_charged"] + 1e-9


# How a limit is set on the emulator, how OpenRouter answers once it is spent, and how it is lifted.
LIMITS = {
    "credit": ("--credit-limit", "credit_exhausted", {"limit": None}),  # 402: the balance is spent
    "key": ("--key-limit", "key_limit", {"key_limit": None}),  # 403 openrouter_key_limit
}


@pytest.mark.parametrize("limit", sorted(LIMITS))
def test_a_limit_reached_mid_set_stops_it_resumable_and_a_rerun_finishes(tmp_path: Path, limit: str) -> None:
    flag, ended_because, lifted = LIMITS[limit]
    prompts = 400
    with rig(
        tmp_path,
        "--tokens-per-s",
        "0",
        "--latency-s",
        "0.05",
        "--mean-tokens",
        "200",
        flag,
        "0.05",
    ) as run:
        run.configure(
            {"credit": prompts},
            generation={"concurrency": 64},
            budget={"usd": 100, "output_tokens_per_dataset": 10_000_000},
        )
        stopped = run.snakemake()
        assert stopped.returncode != 0
        log = (run.workdir / "results" / "logs" / "generate" / "credit.log").read_text().strip().splitlines()
        assert f"ended by {ended_because}" in log[-1] and "rerun to resume" in log[-1]
        summary = run.summary("credit")
        assert summary["ended_because"] == ended_because and summary["failed_permanent"] == 0
        assert f"/{prompts} prompts done" in log[-1]
        kept = len(run.journal("credit"))
        assert 0 < kept < prompts
        charged = run.stats()["usd_charged"]
        assert run.ledger_usd() == pytest.approx(charged, rel=1e-9, abs=1e-12)

        httpx.post(f"{run.url}/emulator/credit", json=lifted).raise_for_status()
        finished = run.snakemake()
        assert finished.returncode == 0, finished.stderr[-3000:]
        ids = [record["prompt_id"] for record in run.responses("credit")]
        assert len(ids) == len(set(ids)) == prompts
        final = run.stats()
        assert final["requests_billed"] == prompts, "a response was bought twice"
        assert run.ledger_usd() == pytest.approx(final["usd_charged"], rel=1e-9, abs=1e-12)
        everything = stopped.stdout + stopped.stderr + finished.stdout + finished.stderr
        assert SECRET not in everything
        assert files_containing(tmp_path, SECRET) == [run.key_file]


FAULTS = [
    {"fault": "burst", "status": 429, "every_s": 4, "duration_s": 1, "retry_after_s": 0.5},
    {
        "fault": "status",
        "status": 429,
        "probability": 0.05,
        "retry_after_s": 0.2,
        "code": "capacity_exhausted",
    },
    {"fault": "status", "status": 502, "probability": 0.04},
    {"fault": "status", "status": 529, "probability": 0.02},
    {"fault": "error_in_200", "probability": 0.04},
    {"fault": "midstream_error", "probability": 0.04},
    {"fault": "empty_choices", "probability": 0.02},
    {"fault": "reset", "probability": 0.04},
    {"fault": "wrong_provider", "probability": 0.03},
    {"fault": "stall", "probability": 0.01, "seconds": 2},
    # Billed answers whose cost only `/generation` knows, while it and `/key` fail now and then.
    {"fault": "cutoff", "probability": 0.03, "after_tokens": 3},
    {"fault": "no_usage", "probability": 0.02},
    {"fault": "null_cost", "probability": 0.02},
    {"fault": "status", "status": 500, "probability": 0.2, "route": "generation"},
    {"fault": "status", "status": 503, "probability": 0.5, "route": "key"},
]


@pytest.mark.budget(
    180,
    reason="300 answers through a seeded storm of faults: mostly the waits its throttles, stalls and retries "
    "ask for (77-101 s alone here, 116-122 s beside another worker)",
)
@pytest.mark.parametrize("stream", [True, False])
def test_storms_of_faults_end_with_every_answer_clean(tmp_path: Path, stream: bool) -> None:
    prompts = 300
    faults = tmp_path / "faults.yaml"
    faults.write_text(yaml.safe_dump(FAULTS))
    with rig(
        tmp_path,
        "--tokens-per-s",
        "0",
        "--latency-s",
        "0.05",
        "--mean-tokens",
        "100",
        "--tokens-per-event",
        "8",
        "--faults",
        str(faults),
        "--fault-seed",
        "3",
    ) as run:
        run.configure(
            {"faults": prompts},
            generation={"concurrency": 64, "stream": stream, "max_attempts": 12},
            budget={"usd": 100, "output_tokens_per_dataset": 10_000_000},
        )
        done = run.snakemake()
        assert done.returncode == 0, done.stderr[-3000:]
        records = run.responses("faults")
        assert sorted(r["prompt_id"] for r in records) == sorted({r["prompt_id"] for r in records})
        assert len(records) == prompts
        for record in records:
            assert record["provider"] in ALLOWED
            assert record["response"]["finish_reason"] in {"stop", "length"}
        stats = run.stats()
        injected = stats["faults"]
        assert injected.get("burst", 0) + injected.get("status", 0) > 0 and injected.get("reset", 0) > 0
        summary = run.summary("faults")
        by_class = summary["errors_by_class"]
        throttled = by_class.get("rate_limited", 0) + by_class.get("capacity_exhausted", 0)
        assert summary["retries"] > 0 and throttled > 0
        # Discarded answers from a provider outside the allowlist were charged, and the ledger says so.
        assert 0 < summary["billed_by_outcome"].get("discarded", 0) <= injected.get("wrong_provider", 0)
        # Every answer priced only by `/generation` was priced there, through its 500s (a reset leaves its
        # request unresolved: `/generation` never learns of it, so it is held until the grace has passed).
        unpriced = injected["cutoff"] + injected["no_usage"] + injected["null_cost"]
        assert summary["recovered"] == unpriced
        assert injected["status@generation"] > 0
        assert run.ledger_usd() == pytest.approx(stats["usd_charged"], rel=1e-9, abs=1e-12)


def test_heavy_tailed_token_budget_overshoots_at_most_one_percent(tmp_path: Path) -> None:
    budget = 150_000
    with rig(
        tmp_path,
        "--tokens-per-s",
        "400",
        "--latency-s",
        "0.05",
        "--mean-tokens",
        "250",
        "--length-sigma",
        "1.2",
        "--tokens-per-event",
        "16",
    ) as run:
        run.configure(
            {"tokens": 3000},
            generation={"concurrency": 200, "max_tokens": 1500},
            budget={"usd": 100, "output_tokens_per_dataset": budget},
        )
        done = run.snakemake()
        assert done.returncode == 0, done.stderr[-3000:]
        summary = run.summary("tokens")
        assert summary["ended_because"] == "token_budget" and summary["truncated"] > 0
        total = sum(r["usage"]["completion_tokens"] for r in run.responses("tokens"))
        assert total == summary["completion_tokens"]
        assert 0.97 * budget <= total <= 1.01 * budget


def test_two_sets_at_once_in_order_share_one_dollar_budget(tmp_path: Path) -> None:
    """budget.policy in_order: the sets spend the run's budget as they come, and the one it stops fails."""
    usd = 2.0
    with rig(
        tmp_path,
        "--tokens-per-s",
        "300",
        "--latency-s",
        "0.05",
        "--mean-tokens",
        "150",
        "--length-sigma",
        "1.0",
        "--tokens-per-event",
        "16",
    ) as run:
        run.configure(
            {"left": 5000, "right": 5000},
            generation={"concurrency": 300, "max_tokens": 2000},
            budget={"usd": usd, "output_tokens_per_dataset": 10_000_000, "policy": "in_order"},
        )
        done = run.snakemake("--resources", "api=2")
        assert done.returncode != 0  # neither set finished: the dollars ran out first
        summaries = [run.summary(name) for name in ("left", "right")]
        assert {s["ended_because"] for s in summaries} == {"dollar_budget"}
        assert all(s["done"] > 100 for s in summaries), "both sets generated"
        spent = run.stats()["usd_charged"]
        assert 0.99 * usd <= spent <= usd + 0.5
        assert run.ledger_usd() == pytest.approx(spent, rel=1e-9, abs=1e-12)
        log_dir = run.workdir / "results" / "logs" / "generate"
        logs = "".join((log_dir / f"{n}.log").read_text() for n in ("left", "right"))
        assert "raise budget.usd" in logs


def test_shared_dollars_end_every_set_partial_then_a_raise_buys_only_the_rest(tmp_path: Path) -> None:
    """budget.policy share: each set may spend its part of budget.usd and ends complete for now with what
    it bought; raising budget.usd reruns the sets it stopped, which buy only what their journals lack, and
    not a set the dollars did not stop."""
    emulator = ("--tokens-per-s", "0", "--latency-s", "0.02", "--mean-tokens", "150", "--length-sigma", "0.5")
    with rig(tmp_path, *emulator) as run:
        sets = {"small": 4, "left": 300, "right": 300}
        budget = {"usd": 0.15, "output_tokens_per_dataset": 10_000_000}
        run.configure(sets, generation={"concurrency": 20, "max_tokens": 600}, budget=budget)
        done = run.snakemake("--resources", "api=2")
        assert done.returncode == 0, done.stderr[-3000:]
        summaries = {name: run.summary(name) for name in sets}
        assert summaries["small"]["ended_because"] == "all_done" and summaries["small"]["partial"] is None
        for name in ("left", "right"):
            assert summaries[name]["ended_because"] == "dollar_budget"
            assert summaries[name]["partial"] == "dollar_budget"
            assert 0 < len(run.responses(name)) < sets[name]
            assert summaries[name]["dollars"] <= 0.05 + 1e-9  # its share: $0.15 over three sets
        assert run.ledger_usd() <= 0.15 + 1e-9
        assert "raise budget.usd" in done.stderr
        billed_first = run.stats()["requests_billed"]
        small_before = (run.workdir / "results" / "small" / "responses.jsonl").stat().st_mtime_ns

        run.configure(sets, generation={"concurrency": 20, "max_tokens": 600}, budget={**budget, "usd": 100})
        plan = run.snakemake("-n")
        assert plan.returncode == 0, plan.stderr[-3000:]
        planned = plan.stdout + plan.stderr
        assert "output: results/left/responses.jsonl" in planned
        assert "output: results/small/responses.jsonl" not in planned
        done = run.snakemake("--resources", "api=2")
        assert done.returncode == 0, done.stderr[-3000:]
        for name in ("left", "right"):
            assert run.summary(name)["ended_because"] == "all_done"
            assert len(run.responses(name)) == sets[name]
        bought = [record["prompt_id"] for name in sets for record in run.journal(name)]
        assert len(bought) == len(set(bought)) == sum(sets.values())
        assert billed_first < run.stats()["requests_billed"] == sum(sets.values())
        assert (run.workdir / "results" / "small" / "responses.jsonl").stat().st_mtime_ns == small_before


def test_the_seeds_in_flight_budget_at_2000_in_flight_finishes_the_set_unattended(tmp_path: Path) -> None:
    """The real config's first second: 2000 requests whose worst case is $0.05 each (max_tokens 20,000 at
    $2.50/M) against $100 of credit whose in-flight budget holds only $5 of them (100 requests).
    OpenRouter answers 402 openrouter_in_flight_budget with Retry-After; the client waits, lowers its
    concurrency and finishes the set without a manual step, nothing bought twice, the ledger equal to the
    charges."""
    prompts = 3000
    with rig(
        tmp_path,
        "--tokens-per-s",
        "0",
        "--latency-s",
        "2",
        "--mean-tokens",
        "300",
        "--tokens-per-event",
        "64",
        "--credit-limit",
        "100",
        "--in-flight-budget",
        "5",
    ) as run:
        run.configure(
            {"seeds": prompts},
            generation={"concurrency": 2000, "max_tokens": 20_000},
            budget={"usd": 100, "output_tokens_per_dataset": 10_000_000},
        )
        started = time.monotonic()
        done = run.snakemake(timeout=900)
        wall_s = time.monotonic() - started
        assert done.returncode == 0, done.stderr[-3000:]
        assert len({r["prompt_id"] for r in run.responses("seeds")}) == prompts
        stats, summary = run.stats(), run.summary("seeds")
        refused = summary["errors_by_class"].get("in_flight_budget", 0)
        assert refused > 0 and stats["errors"]["402"] == refused
        assert stats["requests_billed"] == prompts, "a response was bought twice"
        assert summary["concurrency_lowest"] < 2000 and summary["concurrency_cuts"] > 0
        assert summary["failed_permanent"] == summary["failed_transient"] == 0
        assert run.ledger_usd() == pytest.approx(stats["usd_charged"], rel=1e-9, abs=1e-12)
        print(
            f"in-flight rehearsal: {prompts} answers, {refused} in-flight-budget 402s, lowest concurrency "
            f"{summary['concurrency_lowest']} after {summary['concurrency_cuts']} cuts, wall {wall_s:.0f} s, "
            f"${stats['usd_charged']:.2f} charged"
        )
