"""The engine source against real vLLM (CPU build, .venv-vllm from `make vllm-env`) serving the embedded
SmolLM2 on loopback: the ids a generation job records are the ones vLLM's offline `LLM.chat` produces; a
job killed mid-set and rerun asks the server only for what its journal lacks; and a run that mixes the
three sources (the emulator as OpenRouter, the engine, an imported file) builds the whole chain."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml
from stage_settings import default_config
from support.answers import answer_engine_set
from tiny_run import PROMPTS, RESULTS_ROOT, snakemake, snakemake_command, tiny_config, write_prompts

from eaglepipe.answers.engine import EngineServer, EngineSettings, running_engine
from eaglepipe.openrouter.journal import read_records

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.slow,
    # Each test starts vLLM (a job its server, the reference its offline engine) or runs the whole chain
    # against one: 80-90 s each.
    pytest.mark.budget(300, reason="vLLM started by a job, and a whole chain against vLLM"),
]

REPO = Path(__file__).resolve().parent.parent
VLLM_PYTHON = REPO / ".venv-vllm" / "bin" / "python"
# On CPU: no graph capture (minutes here), and a context the 2 GiB KV cache holds.
VLLM_ARGS = ["--max-model-len", "2048", "--enforce-eager"]
MAX_TOKENS = 24
QUESTIONS = [
    "Name a colour.", "What is 3 plus 4?", "Say hi.", "Name a fruit.", "Write a haiku about rain.",
    "What is the capital of Italy?", "Count to three.", "Give me a word that rhymes with cat.",
    "Name a planet.", "What do bees make?", "Spell the word cat.", "Name a day of the week.",
]


@pytest.fixture(autouse=True)
def _small_kv_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    if not VLLM_PYTHON.exists():
        pytest.fail(f"{VLLM_PYTHON} is missing: run `make vllm-env`, or deselect with -m 'not vllm'")
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "2")  # GiB; vLLM's default takes far more


def engine_section(**overrides: object) -> dict[str, object]:
    return {"python": str(VLLM_PYTHON), "gpus": 0, "args": VLLM_ARGS, "start_timeout_s": 600, **overrides}


def offline_chat(model_dir: Path, conversations: list[list[dict]], work: Path) -> list[dict]:
    requests = work / "offline-requests.json"
    requests.write_text(json.dumps(conversations))
    out = work / "offline.json"
    command = [str(VLLM_PYTHON), str(REPO / "tests" / "vllm_offline_chat.py"), "--model", str(model_dir),
               "--requests", str(requests), "--max-tokens", str(MAX_TOKENS), "--out", str(out)]
    run = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-4000:]
    return json.loads(out.read_text())


@pytest.mark.budget(240, reason="starts vllm serve (about 60 s) and an offline vLLM for the reference, each "
                   "answering one request at a time: 100 s on two busy cores")
def test_the_job_starts_vllm_and_records_the_ids_it_produced(model_dir: Path, tmp_path: Path) -> None:
    """The job's own start of `vllm serve` is under test, so it uses no running server."""
    config = default_config(
        api={"model": "local/smollm2"},
        answers={"source": "engine"},
        engine=engine_section(),
        # One request at a time, as the reference is computed: batched, a greedy near-tie may flip (CI
        # saw one at the 13th token of q2 at four in flight).
        generation={"max_tokens": MAX_TOKENS, "temperature": 0.0, "top_p": 1.0, "concurrency": 1,
                    "request_timeout_s": 300},
        target={"name": "HuggingFaceTB/SmolLM2-135M-Instruct", "path": str(model_dir)},
    )
    prompts = [{"id": f"q{i}", "messages": [{"role": "user", "content": text}]}
               for i, text in enumerate(QUESTIONS)]
    prompt_file = tmp_path / "prompts.jsonl"
    prompt_file.write_text("".join(json.dumps(p) + "\n" for p in prompts))
    responses = tmp_path / "s" / "responses.jsonl"
    summary = answer_engine_set(
        config,
        prompt_file,
        responses.parent,
        ledger=tmp_path / ".engine-ledger",
        engine_log=tmp_path / "engine.log",
        output_token_budget=100_000,
    )
    assert summary["done"] == len(QUESTIONS) and summary["dollars"] == 0
    records = [json.loads(line) for line in responses.read_text().splitlines()]
    offline = offline_chat(model_dir, [p["messages"] for p in prompts], tmp_path)
    for record, reference in zip(records, offline, strict=True):
        assert record["source"] == "engine" and record["provider"] == "vllm"
        assert record["response"]["token_ids"] == reference["token_ids"], record["prompt_id"]
        assert record["response"]["prompt_token_ids"] == reference["prompt_token_ids"], record["prompt_id"]
        assert record["response"]["finish_reason"] == reference["finish_reason"]
        assert record["usage"]["completion_tokens"] == len(reference["token_ids"])


@pytest.fixture(scope="module")
def vllm_server(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[EngineServer]:
    """A server the team keeps running (`engine.base_url`), outliving the jobs that use it."""
    saved = os.environ.get("VLLM_CPU_KVCACHE_SPACE")
    os.environ["VLLM_CPU_KVCACHE_SPACE"] = "2"
    engine = EngineSettings.from_section({"server": "vllm", "base_url": None, "model": None,
                                          **engine_section()})
    try:
        with running_engine(engine, target_path=str(model_dir), served_name="smollm2",
                            python=str(VLLM_PYTHON),
                            log_path=tmp_path_factory.mktemp("vllm") / "server.log") as server:
            yield server
    finally:
        if saved is None:
            os.environ.pop("VLLM_CPU_KVCACHE_SPACE", None)
        else:
            os.environ["VLLM_CPU_KVCACHE_SPACE"] = saved


def answered_requests(server: EngineServer) -> int:
    """Requests the server finished (stopped or cut at max_tokens), from its Prometheus metrics."""
    text = httpx.get(server.base_url.removesuffix("/v1") + "/metrics", timeout=10).text
    pattern = r'^vllm:request_success_total\{[^}]*finished_reason="(stop|length)"[^}]*\} ([0-9.]+)$'
    return round(sum(float(m[2]) for m in re.finditer(pattern, text, re.M)))


IMPORTED = [
    ("What colour is the sky?", "The sky is blue on a clear day."),
    ("Name a number.", "Seven."),
    ("What is ice?", "Ice is frozen water."),
]


def mixed_workdir(workdir: Path, model_dir: Path, server: EngineServer) -> Path:
    """The tiny run with three sources: tiny-a bought from the emulator, tiny-b from the engine, tiny-c
    imported from a file of finished conversations (which is also its prompt source)."""
    (workdir / "sources").mkdir()
    write_prompts(workdir, "tiny-a", PROMPTS["tiny-a"])
    write_prompts(workdir, "tiny-b", QUESTIONS)
    conversations = [{"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": a}]}
                     for q, a in IMPORTED]
    (workdir / "sources" / "tiny-c.jsonl").write_text("".join(json.dumps(c) + "\n" for c in conversations))
    config = tiny_config(model_dir)
    config["datasets"] = ["tiny-a", "tiny-b", "tiny-c"]
    config["sources"] = {
        "tiny-a": {"type": "jsonl", "path": "sources/tiny-a.jsonl"},
        "tiny-b": {"type": "jsonl", "path": "sources/tiny-b.jsonl"},
        "tiny-c": {"type": "jsonl", "path": "sources/tiny-c.jsonl", "strip_trailing_assistant": True},
    }
    config["answers"] = {"sets": {"tiny-b": {"source": "engine"},
                                  "tiny-c": {"source": "import", "path": "sources/tiny-c.jsonl"}}}
    config["engine"] = {"base_url": server.base_url, "model": server.model}
    config["generation"].update(concurrency=2, max_tokens=MAX_TOKENS, request_timeout_s=300)
    (workdir / "tiny.yaml").write_text(yaml.safe_dump(config))
    return workdir / RESULTS_ROOT


def test_a_killed_engine_set_resumes_asking_only_what_it_lacks_and_three_sources_build_a_drafter(
    model_dir: Path, vllm_server: EngineServer, tmp_path: Path
) -> None:
    results = mixed_workdir(tmp_path, model_dir, vllm_server)
    journal = results / "tiny-b" / ".journal"
    target = f"{RESULTS_ROOT}/tiny-b/responses.jsonl"
    command = snakemake_command(tmp_path, "--configfile", str(tmp_path / "tiny.yaml"), "--cores", "2", target)
    with open(tmp_path / "killed.log", "w") as log:
        job = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 300
    while len(read_records(journal)) < 3 and job.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    os.killpg(job.pid, signal.SIGKILL)
    job.wait()
    journaled = {record["prompt_id"] for record in read_records(journal)}
    assert 3 <= len(journaled) < len(QUESTIONS), (tmp_path / "killed.log").read_text()[-3000:]
    assert not (results / "tiny-b" / "responses.jsonl").exists()
    time.sleep(2)  # requests cut by the kill end on the server as aborted, not answered
    before = answered_requests(vllm_server)

    assert snakemake(tmp_path, "--unlock").returncode == 0  # as the README says after a kill
    run = snakemake(tmp_path, timeout=1500)
    assert run.returncode == 0, run.stderr[-4000:]

    # One short probe (does the server return ids?) and each prompt the journal lacked, once.
    assert answered_requests(vllm_server) - before == 1 + len(QUESTIONS) - len(journaled)
    summary = json.loads((results / "tiny-b" / "responses.summary.json").read_text())
    assert (summary["done"], summary["resumed"]) == (len(QUESTIONS), len(journaled))
    records = [json.loads(line) for line in (results / "tiny-b" / "responses.jsonl").read_text().splitlines()]
    assert {record["source"] for record in records} == {"engine"}
    assert all(record["response"]["token_ids"] for record in records)
    sources = {}
    for ds in ("tiny-a", "tiny-b", "tiny-c"):
        lines = (results / ds / "responses.jsonl").read_text().splitlines()
        sources[ds] = {json.loads(line)["source"] for line in lines}
        stats = json.loads((results / ds / "tokens.json").read_text())
        assert stats["counts"]["kept"] == len(lines), ds
        assert json.loads((results / ds / "hidden.done").read_text())["num_samples"] == len(lines)
    assert sources == {"tiny-a": {"openrouter"}, "tiny-b": {"engine"}, "tiny-c": {"import"}}
    gate = json.loads((results / "tiny-b" / "tokens.json").read_text())["round_trip"]
    assert gate["samples"] == len(QUESTIONS)
    train = json.loads((results / "drafter" / "train.json").read_text())
    assert set(train["train_samples_by_set"]) == {"tiny-a", "tiny-b", "tiny-c"}
    assert all(train["train_samples_by_set"].values())
