"""Real vLLM (CPU build, in .venv-vllm from `make vllm-env`) serves the exported drafter as we evaluate it.

The drafter is trained on the tiny run's hidden states (all eight prompts, so that it accepts often enough for
a wrong aux layer or a misread weight to show), evaluated by `evaluate` and served by vLLM through
tests/vllm_drafter.py: vLLM must emit the same greedy tokens with and without it, feed it the intended aux
layers and count, per prompt and per draft position, the same verify steps and accepted drafts.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from budget import shared_budget
from stage_settings import eval_settings, train_settings
from tiny_run import PROMPTS, RESULTS_ROOT
from vllm_runs import run_vllm

from eaglepipe.drafter.evaluate import evaluate
from eaglepipe.drafter.holdout import holdout_prompts
from eaglepipe.drafter.train import train_drafter

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

NUM_STEPS = 3
MAX_NEW_TOKENS = 16


@pytest.fixture(scope="module")
@shared_budget(240, reason="a drafter trained 60 epochs, evaluated, and two vLLM runs: about 40 s")
def served(tiny_pipeline: Path, model_dir: Path, tmp_path_factory) -> dict:
    root = tiny_pipeline / RESULTS_ROOT
    work = tmp_path_factory.mktemp("vllm")
    drafter = work / "drafter"
    settings = train_settings(draft_vocab_size=512, ttt_length=NUM_STEPS, lr=3e-3, epochs=60,
                              batch_tokens=1024, max_seq_len=256)
    train_drafter([root / ds / "hidden.done" for ds in PROMPTS], model_dir, drafter, holdout_ids=set(),
                  settings=settings)
    prompts = []
    for ds in PROMPTS:
        stats = root / ds / "tokens.json"
        every_id = json.loads(stats.read_text())["prompt_ids"]
        held_out = holdout_prompts([ds], [root / ds / "tokens.safetensors"], [stats], every_id)
        prompts += [ids for _, _, ids in held_out]
    chain = eval_settings(num_steps=NUM_STEPS, num_draft_tokens=NUM_STEPS + 1, max_new_tokens=MAX_NEW_TOKENS)
    report = evaluate(drafter, model_dir, prompts, chain)
    runs = run_vllm(model_dir, prompts, work / "runs", {"plain": None, "speculative": drafter},
                    max_tokens=MAX_NEW_TOKENS, num_steps=NUM_STEPS)
    (plain, _), (speculative, log) = runs["plain"], runs["speculative"]
    return {"eval": report, "plain": plain, "speculative": speculative, "log": log,
            "config": json.loads((drafter / "config.json").read_text())}


def test_vllm_greedy_output_is_the_same_with_and_without_the_drafter(served):
    plain, speculative = served["plain"]["outputs"], served["speculative"]["outputs"]
    assert plain == speculative
    # Our loop emitted the same number of tokens: the prefill's one plus the verified ones.
    ours = served["eval"]["methods"]["eagle3"]["per_prompt"]
    assert [len(out) for out in plain] == [p["tokens"] + 1 for p in ours]


def test_vllm_feeds_the_drafter_the_intended_aux_layers(served):
    intended = served["config"]["eagle_config"]["eagle_aux_hidden_state_layer_ids"]  # output of layer i
    logged = r"Using auxiliary layers from speculative config: \((\d+), (\d+), (\d+)\)"
    used = re.findall(logged, served["log"])
    assert used, "vLLM logged no aux-layer ids:\n" + served["log"][-3000:]
    assert {tuple(int(i) for i in ids) for ids in used} == {tuple(i + 1 for i in intended)}  # input of layer


def test_vllm_counts_the_verify_steps_and_accepted_drafts_of_our_evaluation(served):
    ours = served["eval"]["methods"]["eagle3"]
    vllm = served["speculative"]["per_prompt"]
    assert [p["drafts"] for p in vllm] == [p["target_forwards"] for p in ours["per_prompt"]]
    assert [p["accepted_drafts"] for p in vllm] == [p["accepted_drafts"] for p in ours["per_prompt"]]
    ours_per_position = [p["accepted_per_position"] for p in ours["per_prompt"]]
    assert [p["accepted_per_position"] for p in vllm] == ours_per_position
    # The drafter accepts often enough that wrong aux layers or weights would change these counts.
    assert ours["accepted_drafts"] >= ours["target_forwards"]
