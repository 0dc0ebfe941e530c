"""Kimi answers rehearsed end to end: Snakemake buys the offline Kimi corpus from the emulator's Kimi mode
(real HTTP, the real client, each endpoint with its provider's habits) and the token stage rebuilds the ids
on a Kimi-layout target, where every sample's true ids are known.

Each leg reports the token stage's shares (`pytest -s` shows them). A provider whose tool parser leaks the
tool section into the content is caught by the usability probe and dropped by the circuit breaker.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from safetensors.torch import load_file
from support.emulator import running_emulator
from support.emulator.kimi_mode import rendered_prompt
from support.emulator.kimi_synthetic import TrueSample, kimi_corpus
from tiny_run import snakemake_command

from eaglepipe.target.chat_format import chat_format_for
from eaglepipe.tokens.methods import EXACT_METHODS, Method

pytestmark = pytest.mark.slow

MODEL = "moonshotai/kimi-k2.5"
COUNT, SEED = 32, 11
# The rehearsal's request asks for thinking (config.yaml), so the set holds the corpus's thinking samples.
LEGS: dict[str, dict[str, Any]] = {
    "server_ids": {"endpoints": {"vllm-ids": {"text_like": "vllm_ids"}}, "stream": True},
    "rebuilt": {
        "endpoints": {
            "sglang": {"text_like": "sglang", "reasoning_field": "details_only", "tool_index": "zero"}
        },
        "stream": False,
    },
}


class KimiRun:
    """A work directory whose one prompt set is the corpus's thinking samples, and an emulator serving it."""

    def __init__(self, tmp_path: Path, kimi, samples: list[TrueSample]) -> None:
        self.tmp_path = tmp_path
        self.workdir = tmp_path / "work"
        (self.workdir / "sources").mkdir(parents=True)
        self.samples = samples
        lines = [json.dumps({k: v for k, v in s.prompt.items() if k != "id"}) for s in self.samples]
        (self.workdir / "sources" / "kimi.jsonl").write_text("\n".join(lines) + "\n")
        # By the prompt the token stage renders: the prompt stage drops keys the template does not read.
        self.truth = {
            rendered_prompt(chat_format_for(kimi), s.prompt["messages"], s.prompt.get("tools"), s.thinking): s
            for s in samples
        }
        key_file = tmp_path / "openrouter.key"
        key_file.write_text("sk-or-v1-KIMIREHEARSAL\n")
        key_file.chmod(0o600)
        self.env = {**os.environ, "OPENROUTER_KEY_FILE": str(key_file), "HF_HUB_OFFLINE": "1"}

    def emulator(self, kimi_dir: Path, endpoints: dict[str, tuple[float, dict[str, str]]]):
        config = {
            "endpoints": [
                {
                    "provider_name": tag,
                    "tag": tag,
                    "quantization": "int4",
                    "price_per_m": [0.6, completion],
                    "habits": habits,
                }
                for tag, (completion, habits) in endpoints.items()
            ]
        }
        (self.tmp_path / "endpoints.yaml").write_text(yaml.safe_dump(config))
        args = [
            "--latency-s",
            "0",
            "--tokens-per-s",
            "0",
            "--model-id",
            MODEL,
            "--config",
            str(self.tmp_path / "endpoints.yaml"),
            "--kimi-corpus",
            str(kimi_dir),
            "--kimi-count",
            str(COUNT),
            "--kimi-seed",
            str(SEED),
            "--tokens-per-event",
            "4",
        ]
        return running_emulator(None, extra_args=args, log_path=self.tmp_path / "emulator.log")

    def snakemake(self, url: str, kimi_dir: Path, target: str, **generation: Any) -> None:
        config = {
            "datasets": ["kimi"],
            "sources": {"kimi": {"type": "jsonl", "path": "sources/kimi.jsonl"}},
            "target": {"name": "kimi-layout", "path": str(kimi_dir), "embedded": False},
            "api": {"base_url": url, "model": MODEL},
            "generation": {"max_tokens": 8192, "concurrency": 4, "return_token_ids": True, **generation},
        }
        (self.workdir / "run.yaml").write_text(yaml.safe_dump(config))
        command = snakemake_command(
            self.workdir, "--configfile", str(self.workdir / "run.yaml"), "--cores", "2", target
        )
        run = subprocess.run(command, capture_output=True, text=True, timeout=600, env=self.env)
        assert run.returncode == 0, run.stderr[-4000:]


@pytest.fixture(scope="module")
def corpus(kimi) -> list[TrueSample]:
    """The corpus's thinking samples."""
    return [s for s in kimi_corpus(kimi, COUNT, SEED) if s.thinking]


@pytest.mark.parametrize("leg", sorted(LEGS))
def test_the_token_stage_gets_the_true_ids_of_what_it_labels_exact_or_count_matched(
    tmp_path: Path, kimi, kimi_dir: Path, corpus: list[TrueSample], leg: str
) -> None:
    run, settings = KimiRun(tmp_path, kimi, corpus), LEGS[leg]
    endpoints = {tag: (2.5, habits) for tag, habits in settings["endpoints"].items()}
    with run.emulator(kimi_dir, endpoints) as url:
        run.snakemake(url, kimi_dir, "results/kimi/tokens.json", stream=settings["stream"])
    stats = json.loads((run.workdir / "results" / "kimi" / "tokens.json").read_text())
    summary = json.loads((run.workdir / "results" / "kimi" / "responses.summary.json").read_text())
    assert summary["probed"] and not summary["breaker"]["strikes"], summary  # marker text the model wrote
    tensors = load_file(str(run.workdir / "results" / "kimi" / "tokens.safetensors"))
    offsets, prompt_len = tensors["offsets"].tolist(), tensors["prompt_len"].tolist()
    checked = {"exact": 0, "hazard_free": 0}
    for row, prompt_id in enumerate(stats["prompt_ids"]):
        prompt_end = offsets[row] + prompt_len[row]
        truth = run.truth[tuple(tensors["input_ids"][offsets[row] : prompt_end].tolist())]
        ids = tensors["input_ids"][prompt_end : offsets[row + 1]].tolist()
        if Method(int(tensors["method"][row])) in EXACT_METHODS:
            assert ids == truth.ids, (leg, prompt_id)
            checked["exact"] += 1
        if not truth.hazards:  # nothing hides these from the text: rebuilt, they are the true ids
            assert ids == truth.ids, (leg, prompt_id)
            checked["hazard_free"] += 1
    print(f"\n{leg}: {len(run.samples)} prompts, shares {stats['shares']}, true ids checked {checked}")
    assert checked["hazard_free"] == sum(not s.hazards for s in run.samples) > 0
    if leg == "server_ids":
        assert checked["exact"] == len(run.samples) and stats["shares"]["exact"] == 1
    else:
        assert checked["exact"] == stats["shares"]["exact"] == 0
        assert stats["shares"]["rebuilt_count_matched"] > 0.5


def test_a_provider_whose_tool_parser_leaks_markers_is_dropped_by_the_breaker(
    tmp_path: Path, kimi, kimi_dir: Path, corpus: list[TrueSample]
) -> None:
    """The cheapest provider leaks its tool sections into the content: the probe finds the marker text,
    the breaker drops it, and the rest of the set is bought from the sound one."""
    run = KimiRun(tmp_path, kimi, corpus)  # the model writes marker text in some answers: no strike
    endpoints = {
        "leaky": (1.0, {"text_like": "vllm", "tool_parser": "leaks_markers"}),
        "sound": (3.0, {"text_like": "vllm"}),
    }
    with run.emulator(kimi_dir, endpoints) as url:
        run.snakemake(
            url,
            kimi_dir,
            "results/kimi/responses.jsonl",
            stream=True,
            breaker_strikes=2,
            max_failed_fraction=1.0,
        )
    summary = json.loads((run.workdir / "results" / "kimi" / "responses.summary.json").read_text())
    assert "leaky" in summary["breaker"]["dropped"], summary["breaker"]
    reasons = summary["breaker"]["strikes"]["leaky"]
    assert all("marker_text_in_reply" in reason for reason in reasons), reasons
    providers = [
        json.loads(line)["provider"]
        for line in (run.workdir / "results" / "kimi" / "responses.jsonl").read_text().splitlines()
    ]
    assert providers[-1] == "sound" and "sound" not in summary["breaker"]["dropped"]
