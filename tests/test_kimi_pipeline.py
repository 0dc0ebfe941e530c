"""The whole chain on the real run's architecture, through Snakemake itself: the kimi-tiny configuration
(config/kimi-tiny.yaml) made small, on the tiny Kimi-K2.5 target. The emulator serves the target's own
forward pass with reasoning and tool calls through Kimi's markers, the token stage rebuilds the ids through
Kimi's chat format, real vLLM extracts the hidden states, and the drafter is trained, exported for a
kimi_k25 target (and in speculators' format), evaluated and reported."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from budget import shared_budget
from build_cache import cached, copy_of, file_identity, source_key
from tiny_run import REPO, snakemake

from eaglepipe.target.tiny import KIMI_K25_TINY

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

RESULTS = "results/kimi-tiny"
SETS = {"kimi-chat": "demo-chat", "kimi-tools": "demo-tools"}  # 6 prompts of each embedded demo set
VLLM_PYTHON = REPO / ".venv-vllm" / "bin" / "python"


@pytest.fixture(scope="module")
@shared_budget(360, reason="the whole chain on the tiny Kimi-K2.5, hidden states through vLLM: about 105 s")
def kimi_run(tiny_targets, tmp_path_factory) -> Path:
    """The chain's run, built once per change of the code (tests/build_cache.py) and copied for this
    module, whose report test writes into it. The pipeline's hidden jobs start vLLM themselves, as a real
    run's do: that is part of the chain."""
    if not VLLM_PYTHON.is_file():
        pytest.fail(f"{VLLM_PYTHON} is missing: run `make vllm-env`, or deselect with -m 'not vllm'")
    target = tiny_targets[KIMI_K25_TINY]
    key = source_key([Path(__file__)], target=file_identity(target / "model.safetensors"))
    built = cached("kimi-pipeline", key, lambda workdir: run_the_chain(workdir, target))
    return copy_of(built, tmp_path_factory.mktemp("kimi-pipeline") / "run")


def run_the_chain(workdir: Path, target: Path) -> None:
    (workdir / "sources").mkdir()
    for ds, demo in SETS.items():
        lines = (REPO / "resources" / "sources" / "demo" / f"{demo}.jsonl").read_text().splitlines()[:6]
        (workdir / "sources" / f"{ds}.jsonl").write_text("\n".join(lines) + "\n")
    config = yaml.safe_load((REPO / "config" / "kimi-tiny.yaml").read_text())
    config.update(
        datasets=list(SETS),
        sources={ds: {"type": "jsonl", "path": f"sources/{ds}.jsonl"} for ds in SETS},
    )
    config["target"].update(path=str(target), embedded=False)
    config["hidden"]["engine_python"] = str(VLLM_PYTHON)
    config["drafter"].update(epochs=4, draft_vocab_size=4096)
    config["eval"].update(holdout_per_dataset=1, max_new_tokens=16)
    (workdir / "kimi.yaml").write_text(yaml.safe_dump(config))
    run = snakemake(workdir, configfile=workdir / "kimi.yaml", timeout=1500)
    assert run.returncode == 0, run.stderr[-4000:]


def test_the_emulator_serves_reasoning_and_tool_calls_from_the_targets_forward_pass(kimi_run):
    records = [json.loads(line) for line in (kimi_run / RESULTS / "kimi-tools/responses.jsonl").open()]
    assert len(records) == 6
    answers = [r["response"] for r in records]
    assert all(a["reasoning"] for a in answers)  # Kimi-K2.5 thinks unless the request turns it off
    calls = [call for a in answers for call in a.get("tool_calls") or []]
    assert calls and all(call["id"].startswith("functions.") for call in calls)
    assert any(a["finish_reason"] == "tool_calls" for a in answers)


def test_the_token_stage_rebuilds_kimi_ids_from_the_text(kimi_run):
    stats = json.loads((kimi_run / RESULTS / "kimi-chat/tokens.json").read_text())
    assert stats["counts"]["kept"] == 6 and stats["shares"]["billed_count_matched"] == 1.0
    tools = json.loads((kimi_run / RESULTS / "kimi-tools/tokens.json").read_text())
    assert tools["counts"]["kept"] >= 3


def test_hidden_states_come_from_vllm_on_the_kimi_k25_target(kimi_run):
    manifest = json.loads((kimi_run / RESULTS / "kimi-chat/hidden.done").read_text())
    assert manifest["backend"] == "vllm" and manifest["aux_layer_ids"] == [1, 3, 4]
    assert manifest["hidden_size"] == 256


def test_the_drafter_is_exported_for_the_kimi_target_in_both_formats(kimi_run):
    drafter = kimi_run / RESULTS / "drafter"
    config = json.loads((drafter / "config.json").read_text())
    assert (config["vocab_size"], config["head_dim"], config["num_attention_heads"]) == (163840, 32, 4)
    assert config["eagle_aux_hidden_state_layer_ids"] == [2, 4, 5]
    speculators = json.loads((drafter / "speculators" / "config.json").read_text())
    assert speculators["speculators_model_type"] == "eagle3" and "model_type" not in speculators
    verifier = speculators["speculators_config"]["verifier"]
    assert verifier["architectures"] == ["KimiK25ForConditionalGeneration"]
    evaluation = json.loads((drafter / "eval.json").read_text())
    assert evaluation["methods"]["eagle3"]["acceptance_length"] >= 1.0


def test_the_report_shows_the_kimi_shaped_run(kimi_run):
    report = kimi_run / "report.html"
    run = snakemake(kimi_run, "--report", str(report), configfile=kimi_run / "kimi.yaml", timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    html = report.read_text(errors="replace")
    assert "kimi-chat" in html and "kimi-tools" in html and "kimi-k25-tiny" in html  # the target
