"""The real run's architecture through real vLLM (`make vllm-env`), on the tiny Kimi-K2.5
(KimiK25ForConditionalGeneration: a DeepSeek-V3 text model with MLA and MoE under text_config, weights under
`language_model.`) and the tiny DeepSeek-V3 that eaglepipe/target/tiny.py builds:

- hidden states from the `vllm` backend equal the `hf` backend's at the recorded layers, and a control one
  layer off does not;
- the drafter exported for each target, trained on the target's own greedy continuations, is served by vLLM
  with `method: eagle3`: the same greedy tokens with and without it, fed the trained aux layers, with the
  verify steps and accepted drafts (many) of our own evaluation, prompt by prompt;
- the same drafter in speculators' format loads with PyPI's speculators and serves alike;
- both exports name the target as hubs know it, so they load and serve from a copy in another folder, run
  from another working directory, with the target resolved by that name (an offline Hugging Face cache),
  not by the training node's path, which no exported file holds.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
from budget import shared_budget
from safetensors.torch import load_file, save_file
from stage_settings import eval_settings, train_settings
from support.hub_cache import serving_node_with
from test_hidden import extract, settings
from vllm_runs import run_vllm, vllm_python

from eaglepipe.drafter.evaluate import evaluate
from eaglepipe.drafter.export import TargetReference
from eaglepipe.drafter.speculators import export_speculators
from eaglepipe.drafter.train import train_drafter
from eaglepipe.hidden.backends.hf import HFBackend
from eaglepipe.target.architecture import TargetArchitecture
from eaglepipe.target.load import load_target, load_target_tokenizer
from eaglepipe.target.tiny import (
    DEEPSEEK_V3_TINY,
    KIMI_K25_TINY,
    TEACHER_FILES,
    read_conversations,
    teacher_samples,
)

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[1]
NUM_STEPS = 3
MAX_NEW_TOKENS = 24
PROMPTS = 12  # teacher conversations, from every set


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got - want).norm() / want.norm())


@pytest.fixture(scope="module")
def continuations(tiny_targets) -> dict[str, list[tuple[list[int], list[int]]]]:
    """(prompt ids, the target's greedy answer ids with its stop id) per target, from transformers."""
    conversations = read_conversations([REPO / path for path in TEACHER_FILES])[:: 121 // PROMPTS][:PROMPTS]
    out = {}
    for name, directory in tiny_targets.items():
        tokenizer = load_target_tokenizer(directory)
        model = load_target(directory)
        rows = []
        for sample in teacher_samples(tokenizer, conversations):
            prompt = torch.tensor([sample.prompt_ids])
            with torch.no_grad():
                ids = model.generate(
                    prompt,
                    max_new_tokens=MAX_NEW_TOKENS,
                    do_sample=False,
                    eos_token_id=tokenizer.stop_id,
                    pad_token_id=tokenizer.stop_id,
                )
            rows.append((sample.prompt_ids, ids[0, prompt.shape[1] :].tolist()))
        out[name] = rows
    return out


def write_samples(directory: Path, rows: list[tuple[list[int], list[int]]]) -> Path:
    """A token file of the rows (loss on the answers), as the token stage writes it."""
    directory.mkdir(parents=True, exist_ok=True)
    flat, mask, offsets, prompt_len = [], [], [0], []
    for prompt, answer in rows:
        flat += prompt + answer
        mask += [0] * len(prompt) + [1] * len(answer)
        offsets.append(len(flat))
        prompt_len.append(len(prompt))
    path = directory / "tokens.safetensors"
    save_file(
        {
            "input_ids": torch.tensor(flat, dtype=torch.int32),
            "loss_mask": torch.tensor(mask, dtype=torch.uint8),
            "offsets": torch.tensor(offsets),
            "prompt_len": torch.tensor(prompt_len),
            "method": torch.zeros(len(rows), dtype=torch.uint8),
        },
        str(path),
    )
    (directory / "tokens.json").write_text(json.dumps({"prompt_ids": [f"p{i}" for i in range(len(rows))]}))
    return path


@pytest.mark.parametrize("name", [DEEPSEEK_V3_TINY, KIMI_K25_TINY])
def test_vllm_hidden_states_equal_the_hf_backend_at_the_recorded_layers(
    name, tiny_targets, continuations, tmp_path
):
    """The backend starts its own engine (vLLM's `extract_hidden_states` with our connector): that start is
    part of what is checked, so it shares no engine with the drafter runs."""
    token_path = write_samples(tmp_path / "tokens", continuations[name][:6])
    target = tiny_targets[name]
    hf = extract(token_path, target, tmp_path / "hf", shard_tokens=1500)
    vllm = extract(
        token_path,
        target,
        tmp_path / "vllm",
        shard_tokens=1500,
        backend="vllm",
        engine_python=str(vllm_python()),
    )
    assert hf["aux_layer_ids"] == vllm["aux_layer_ids"] == [1, 3, 4]  # EAGLE-3's default for 8 layers
    # The control: the layers vLLM would have fed had the ids gone in unshifted (outputs of 0, 2, 3).
    samples = [torch.tensor(prompt + answer) for prompt, answer in continuations[name][:6]]
    one_off = torch.cat([s.aux for s in HFBackend(settings().backend, target, [0, 2, 3]).states(samples)])
    errors = {}
    for ours, theirs in zip(hf["shards"], vllm["shards"], strict=True):
        want = load_file(str(tmp_path / "hf" / ours["path"]))
        got = load_file(str(tmp_path / "vllm" / theirs["path"]))
        assert torch.equal(got["input_ids"], want["input_ids"])
        for part in ("aux", "final"):
            errors[f"{ours['path']}:{part}"] = relative_error(got[part], want[part])
    vllm_aux = torch.cat([load_file(str(tmp_path / "vllm" / s["path"]))["aux"] for s in vllm["shards"]])
    control = [relative_error(vllm_aux, one_off)]
    print(
        f"{name}: vLLM vs hf, relative error (fp32):",
        {k: f"{v:.1e}" for k, v in errors.items()},
        "one layer off:",
        [f"{c:.2f}" for c in control],
    )
    assert max(errors.values()) < 1e-5
    assert min(control) > 0.1


@pytest.fixture(scope="module", params=[DEEPSEEK_V3_TINY, KIMI_K25_TINY])
@shared_budget(300, reason="per target: a drafter trained 30 epochs, evaluated, then three vLLM runs: ~55 s")
def served(request, tiny_targets, continuations, tmp_path_factory) -> dict:
    name = request.param
    target = tiny_targets[name]
    work = tmp_path_factory.mktemp(f"served-{name}")
    token_path = write_samples(work / "tokens", continuations[name])
    extract(token_path, target, work, shard_tokens=4000)
    drafter = work / "drafter"
    settings = train_settings(
        draft_vocab_size=1024, ttt_length=NUM_STEPS, lr=3e-3, epochs=30, batch_tokens=2048, max_seq_len=1024
    )
    train_drafter([work / "hidden.done"], target, drafter, holdout_ids=set(), settings=settings)
    prompts = [prompt for prompt, _ in continuations[name]]
    report = evaluate(
        drafter,
        target,
        prompts,
        eval_settings(num_steps=NUM_STEPS, num_draft_tokens=NUM_STEPS + 1, max_new_tokens=MAX_NEW_TOKENS),
    )
    # Exported by the target's hub name (the training node's path only as provenance), then carried to a
    # "serving node": another folder, another working directory, the target found by that name in a
    # Hugging Face cache with no network, as after a download. Every run below is from there.
    hub_name = f"eaglepipe-tests/{name}"
    reference = TargetReference(hub_name, str(target), local_only=False)
    speculators_dir = work / "speculators"
    export_speculators(
        drafter,
        speculators_dir,
        target=reference,
        verifier_architectures=[TargetArchitecture.from_dir(target).architecture],
        num_speculative_tokens=NUM_STEPS,
    )
    node = work / "serving-node"
    for folder in (drafter, speculators_dir):
        shutil.copytree(folder, node / "drafters" / folder.name, ignore=shutil.ignore_patterns("snapshots"))
    exported = [path for path in (node / "drafters").rglob("*") if path.is_file()]
    assert not [path for path in exported if str(target).encode() in path.read_bytes()]
    hub = serving_node_with(target, hub_name, node / "hf-home")
    runs = run_vllm(
        target,
        prompts,
        work / "runs",
        {"plain": None, "speculative": node / "drafters" / drafter.name},
        alone={"speculators": node / "drafters" / speculators_dir.name},
        max_tokens=MAX_NEW_TOKENS,
        num_steps=NUM_STEPS,
        served_as=hub_name,
        node=hub,
        cwd=node,
    )
    (plain, _), (speculative, log) = runs["plain"], runs["speculative"]
    as_speculators, _ = runs["speculators"]
    check = [str(vllm_python()), str(REPO / "tests" / "speculators_check.py"), "drafters/speculators"]
    run = subprocess.run(
        [*check, str(work / "facts.json")],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=node,
        env={**os.environ, **hub},
    )
    assert run.returncode == 0, run.stderr[-4000:]
    return {
        "name": name,
        "eval": report,
        "plain": plain,
        "speculative": speculative,
        "log": log,
        "speculators": as_speculators,
        "speculators_facts": json.loads((work / "facts.json").read_text()),
        "config": json.loads((drafter / "config.json").read_text()),
    }


def test_vllm_greedy_output_is_the_same_with_and_without_the_drafter(served):
    plain = served["plain"]["outputs"]
    assert served["speculative"]["outputs"] == plain
    assert served["speculators"]["outputs"] == plain
    ours = served["eval"]["methods"]["eagle3"]["per_prompt"]
    assert [len(out) for out in plain] == [p["tokens"] + 1 for p in ours]


def test_vllm_feeds_the_drafter_the_trained_aux_layers(served):
    trained = served["config"]["eagle_config"]["eagle_aux_hidden_state_layer_ids"]  # output of layer i
    used = re.findall(
        r"Using auxiliary layers from speculative config: \((\d+), (\d+), (\d+)\)", served["log"]
    )
    assert used, "vLLM logged no aux-layer ids:\n" + served["log"][-3000:]
    assert {tuple(int(i) for i in ids) for ids in used} == {tuple(i + 1 for i in trained)}  # input of layer


def test_vllm_counts_the_verify_steps_and_accepted_drafts_of_our_evaluation(served):
    ours = served["eval"]["methods"]["eagle3"]
    for counted in (served["speculative"]["per_prompt"], served["speculators"]["per_prompt"]):
        assert [p["drafts"] for p in counted] == [p["target_forwards"] for p in ours["per_prompt"]]
        assert [p["accepted_drafts"] for p in counted] == [p["accepted_drafts"] for p in ours["per_prompt"]]
        assert [p["accepted_per_position"] for p in counted] == [
            p["accepted_per_position"] for p in ours["per_prompt"]
        ]
    # Drafts are accepted often (more than one per verify step), so a wrong layer or weight would show.
    print(served["name"], "acceptance length:", ours["acceptance_length"])
    assert ours["accepted_drafts"] > ours["target_forwards"]


def test_speculators_and_vllm_read_the_speculators_export_as_the_trained_drafter(served):
    """PyPI's speculators loads every tensor of it (and the verifier's head, from the target's files);
    vLLM's parser sees an Eagle3 draft with the same layers (vLLM's numbering) and the residual order."""
    trained = served["config"]
    facts = served["speculators_facts"]
    ours = facts["speculators"]
    assert ours["tensors_not_loaded"] == [] and ours["verifier_lm_head_loaded"]
    assert ours["verifier"] == f"eaglepipe-tests/{served['name']}"  # its hub name, found in the cache
    assert ours["norm_before_residual"] is False and facts["vllm"]["norm_before_residual"] is False
    assert ours["eagle_aux_hidden_state_layer_ids"] == trained["eagle_aux_hidden_state_layer_ids"]
    assert facts["vllm"]["eagle_aux_hidden_state_layer_ids"] == trained["eagle_aux_hidden_state_layer_ids"]
    assert ours["layer"] == {k: trained[k] for k in ("hidden_size", "num_attention_heads", "head_dim")}
    assert facts["vllm"]["architectures"] == ["Eagle3LlamaForCausalLM"]
