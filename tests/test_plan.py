"""The spend plan, computed from real files: prompt sets, journals, a ledger, providers.json, a target dir."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml
from safetensors.numpy import save_file

from eaglepipe.config import validate_config
from eaglepipe.layout import BUILDERS, RunLayout
from eaglepipe.plan import GOALS, command_line_targets, goal_of, sets_named_by
from eaglepipe.plan.estimate import spend_plan, target_hidden_size
from eaglepipe.plan.model import Prices
from eaglepipe.plan.table import format_plan

REPO = Path(__file__).resolve().parent.parent
FINGERPRINT = "0123456789abcdef"
# The JSON of {"messages": [one user turn with this content], "tools": null} is 350 bytes: 100 tokens at
# the plan's 3.5 bytes per token.
HUNDRED_TOKENS = "a" * 294


def make_config(tmp_path: Path, datasets: list[str], **sections) -> dict:
    config = {
        "datasets": datasets,
        "sources": {ds: {"type": "hf", "name": "org/data", "sample": 40} for ds in datasets},
        "target": {"name": "org/target", "path": str(tmp_path / "target")},
        "api": {"model": "vendor/model"},
        "generation": {"max_tokens": 1000, "expected_completion_tokens": 500},
        "budget": {"usd": 100, "output_tokens_per_dataset": 10_000_000},
        "hidden": {"dtype": "bfloat16"},
    }
    for name, values in sections.items():
        config[name] = {**config.get(name, {}), **values}
    return validate_config(config, REPO / "schemas" / "config.schema.yaml")


def write_lines(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))


def write_prompts(tmp_path: Path, ds: str, count: int, content: str = HUNDRED_TOKENS) -> list[str]:
    ids = [f"{ds}-{i}" for i in range(count)]
    rows = [{"id": pid, "messages": [{"role": "user", "content": content}]} for pid in ids]
    write_lines(tmp_path / "prompts" / f"{ds}.jsonl", rows)
    return ids


def record(prompt_id: str, completion: int | None, prompt: int = 10, fingerprint: str = FINGERPRINT) -> dict:
    usage = {"prompt_tokens": prompt, "completion_tokens": completion, "cost": 0.001}
    return {"prompt_id": prompt_id, "fingerprint": fingerprint, "usage": usage}


def write_journal(tmp_path: Path, ds: str, records: list[dict]) -> None:
    write_lines(tmp_path / "results" / ds / ".journal" / "records.jsonl", records)


def write_providers(tmp_path: Path, model: str = "vendor/model") -> None:
    def endpoint(tag: str, prompt: str, completion: str) -> dict:
        return {"tag": tag, "pricing": {"prompt": prompt, "completion": completion}}

    providers = {
        "model": model,
        "kept": [endpoint("a/int4", "0.000001", "0.00002"), endpoint("b/int4", "0.0000005", "0.0001")],
        "dropped": [{"endpoint": endpoint("c/fp8", "0.01", "0.01"), "reason": "quantization fp8"}],
    }
    (tmp_path / "results").mkdir(parents=True, exist_ok=True)
    (tmp_path / "results" / "providers.json").write_text(json.dumps(providers))


def plan_of(tmp_path: Path, config: dict):
    layout = RunLayout(tmp_path / "results", tmp_path / "prompts")
    return spend_plan(config, config["datasets"], FINGERPRINT, layout=layout)


def by_name(plan) -> dict:
    return {item.name: item for item in plan.sets}


def test_prompts_left_come_from_the_journal_and_the_mean_answer_once_it_has_enough(tmp_path):
    config = make_config(tmp_path, ["A", "B"])
    a_ids, b_ids = write_prompts(tmp_path, "A", 30), write_prompts(tmp_path, "B", 30)
    old = [record(pid, 900, fingerprint="another") for pid in a_ids[25:]]  # another config's: not reused
    write_journal(tmp_path, "A", [record(pid, 100) for pid in a_ids[:25]] + old)
    write_journal(tmp_path, "B", [record(pid, 100) for pid in b_ids[:3]])

    a, b = by_name(plan_of(tmp_path, config)).values()

    assert (a.status, a.prompts, a.left, a.input_tokens) == ("generate", 30, 5, 500)
    assert (a.per_answer, a.per_answer_source, a.output_tokens) == (100, "journal", 500)
    assert (b.left, b.per_answer, b.per_answer_source, b.output_tokens) == (27, 500, "config", 13_500)


def test_unbuilt_prompt_sets_count_the_sources_sample_and_leave_input_tokens_unknown(tmp_path):
    config = make_config(tmp_path, ["A"])
    write_journal(tmp_path, "A", [record(f"A-{i}", 100) for i in range(4)])

    (a,) = plan_of(tmp_path, config).sets

    assert (a.prompts, a.left, a.input_tokens, a.output_tokens, a.usd) == (40, 36, None, 18_000, None)


def test_the_estimate_per_answer_never_exceeds_max_tokens(tmp_path):
    config = make_config(tmp_path, ["A"], generation={"max_tokens": 300, "expected_completion_tokens": 5000})
    write_prompts(tmp_path, "A", 10)

    (a,) = plan_of(tmp_path, config).sets

    assert (a.per_answer, a.output_tokens) == (300, 3000)


def test_the_token_budget_caps_output_and_the_prompts_billed_with_it(tmp_path):
    config = make_config(tmp_path, ["A"], budget={"output_tokens_per_dataset": 2500})
    ids = write_prompts(tmp_path, "A", 30)
    # 19 answers of 100 tokens and one without usage, counted as max_tokens: 2,900 of the 2,500 used.
    write_journal(tmp_path, "A", [record(pid, 100) for pid in ids[:19]] + [record(ids[19], None)])

    (a,) = plan_of(tmp_path, config).sets

    # The mean counts it the same way: (19 * 100 + 1000) / 20 = 145 per answer.
    assert (a.left, a.per_answer, a.per_answer_source) == (10, 145, "journal")
    assert (a.output_tokens, a.capped) == (0, True)
    assert a.input_tokens == 0


def test_a_partly_covered_token_budget_bills_the_share_of_prompts_it_reaches(tmp_path):
    config = make_config(tmp_path, ["A"], budget={"output_tokens_per_dataset": 2500})
    ids = write_prompts(tmp_path, "A", 30)
    write_journal(tmp_path, "A", [record(pid, 100) for pid in ids[:20]])

    (a,) = plan_of(tmp_path, config).sets

    assert (a.left, a.output_tokens, a.capped) == (10, 500, True)
    assert a.input_tokens == 500  # half of the ten prompts' 1,000 input tokens


def test_dollars_use_the_dearest_kept_endpoint_on_each_side(tmp_path):
    config = make_config(tmp_path, ["A"])
    write_prompts(tmp_path, "A", 10)
    write_providers(tmp_path)

    plan = plan_of(tmp_path, config)

    assert (plan.prices.prompt, plan.prices.completion) == (0.000001, 0.0001)
    (a,) = plan.sets
    assert a.usd == pytest.approx(1000 * 0.000001 + 5000 * 0.0001)
    assert "price: $1/M input, $100/M output" in format_plan(plan)


def test_in_order_the_remaining_budget_covers_sets_in_config_order(tmp_path):
    # Each set: 2 prompts, 200 input tokens at $1/M and 2 x 5,000 output tokens at $100/M: $1.0002.
    generation = {"max_tokens": 5000, "expected_completion_tokens": 5000}
    budget = {"usd": 3.0, "policy": "in_order"}
    config = make_config(tmp_path, ["A", "B", "C"], generation=generation, budget=budget)
    for ds in ("A", "B", "C"):
        write_prompts(tmp_path, ds, 2)
    write_providers(tmp_path)
    write_lines(
        tmp_path / "results" / ".ledger" / "ledger.jsonl",
        [
            {"event": "started", "set": "A", "prompt_id": "x", "generation_id": "g1"},
            {"event": "billed", "set": "A", "prompt_id": "x", "generation_id": "g1", "usd": 1.25},
            {"event": "billed", "set": "B", "prompt_id": "y", "generation_id": "g2", "usd": 0.25},
        ],
    )

    plan = plan_of(tmp_path, config)

    assert plan.spent_usd == pytest.approx(1.5)
    assert [item.usd for item in plan.sets] == [pytest.approx(1.0002)] * 3
    assert [item.coverage for item in plan.sets] == ["full", "partly", "no"]
    text = format_plan(plan)
    assert "$1.5000 spent so far, $1.50 left" in text
    assert "covers fully: A" in text and "covers partly: B" in text and "does not cover: C" in text
    assert "(budget.policy in_order); B, C stop short and fail, so no drafter" in text
    config["budget"]["usd"] = 1.0  # already overspent: nothing more is covered
    assert [item.coverage for item in plan_of(tmp_path, config).sets] == ["no", "no", "no"]


def test_shared_dollars_give_every_set_its_part_less_what_it_spent(tmp_path):
    # Each set costs $1.0002 (as above); $1.50 over three sets is $0.50 each, of which A spent $0.25.
    generation = {"max_tokens": 5000, "expected_completion_tokens": 5000}
    config = make_config(tmp_path, ["A", "B", "C"], generation=generation, budget={"usd": 1.5})
    for ds in ("A", "B", "C"):
        write_prompts(tmp_path, ds, 2)
    write_providers(tmp_path)
    write_lines(
        tmp_path / "results" / ".ledger" / "ledger.jsonl",
        [{"event": "billed", "set": "A", "prompt_id": "x", "generation_id": "g1", "usd": 0.25}],
    )

    plan = plan_of(tmp_path, config)

    assert plan.share_usd == pytest.approx(0.5)
    assert [item.coverage for item in plan.sets] == ["partly", "partly", "partly"]
    bought = [item.bought_output_tokens / item.output_tokens for item in plan.sets]
    assert bought == pytest.approx([0.25 / 1.0002, 0.5 / 1.0002, 0.5 / 1.0002], rel=1e-3)
    text = format_plan(plan)
    assert "covers partly: A (25%), B (50%), C (50%)" in text
    assert "In short: with $1.50: 3 sets x up to $0.50 each, 12,498 of 30,000 output tokens, then a " in text
    config["budget"]["usd"] = 0.75  # A's share, $0.25, is spent: it gets nothing more, and so no drafter
    short = format_plan(plan_of(tmp_path, config)).splitlines()[-1]
    assert short == (
        "In short: A spent its $0.25 share of budget.usd with no answer to show, so no drafter from this "
        "run: raise budget.usd."
    )


def kimi_like_target(target: Path) -> None:
    """A DeepSeek-V3-shaped config.json (MLA, a dense first layer, routed and shared experts)."""
    text = {
        "hidden_size": 64, "num_hidden_layers": 3, "vocab_size": 1000, "num_attention_heads": 4,
        "num_key_value_heads": 4, "intermediate_size": 256, "moe_intermediate_size": 32,
        "n_routed_experts": 8, "num_experts_per_tok": 2, "n_shared_experts": 1, "first_k_dense_replace": 1,
        "q_lora_rank": 16,
        "kv_lora_rank": 32, "qk_nope_head_dim": 16, "qk_rope_head_dim": 8, "v_head_dim": 16,
        "rms_norm_eps": 1e-6, "max_position_embeddings": 4096, "rope_theta": 10000.0,
        "model_type": "deepseek_v3", "architectures": ["DeepseekV3ForCausalLM"],
    }
    target.mkdir(parents=True, exist_ok=True)
    (target / "config.json").write_text(json.dumps(text))


def test_the_plan_tells_time_from_the_rates_it_names(tmp_path):
    generation = {"max_tokens": 1000, "expected_completion_tokens": 500, "concurrency": 10}
    config = make_config(
        tmp_path, ["A"], generation=generation, budget={"usd": 1000},
        plan={"tokens_per_s_per_request": 5, "gpu_tflops": 1e-6}, hidden={"gpus": 2}, drafter={"gpus": 1},
    )
    write_prompts(tmp_path, "A", 4)
    write_providers(tmp_path)
    kimi_like_target(tmp_path / "target")

    plan = plan_of(tmp_path, config)

    # 4 answers x 500 tokens at 10 in flight x 5 tokens/s: 40 s.
    assert plan.hours.generation_s == pytest.approx(40)
    # MLA: q 64x16 + 16x4x24, kv 64x40 + 32x4x32, o 4x16x64; MLPs: one dense 3x64x256, two MoE layers of
    # 3 experts' 3x64x32 plus the router 64x8; the LM head 64x1000.
    attention = 64 * 16 + 16 * 4 * 24 + 64 * 40 + 32 * 4 * 32 + 4 * 16 * 64
    active = 3 * attention + 3 * 64 * 256 + 2 * (3 * 64 * 32 * 3 + 64 * 8) + 64 * 1000
    assert plan.hours.active_parameters == active
    hidden_tokens = sum(item.hidden_tokens for item in plan.sets)
    assert hidden_tokens == 4 * 100 + 4 * 500
    assert plan.hours.hidden_gpu_h == pytest.approx(hidden_tokens * 2 * active / 1e6 / 3600)  # 1e-6 TFLOP/s
    assert plan.hours.train_gpu_h > 0
    text = format_plan(plan)
    assert "time, generation: about 40 s at 10 in flight (generation.concurrency) x 5 output tokens/s" in text
    assert "GPU-hours" in text and "on 2 GPU(s) (hidden.gpus)" in text
    assert "(the target's config.json)" in text
    assert "time, training: about" in text and "on 1 GPU(s) (drafter.gpus)" in text
    assert "plus loading the target in each of 1 jobs (unknown until" in text


def test_each_hidden_job_adds_loading_the_target_at_the_rate_it_names(tmp_path):
    """A 1T-parameter target takes minutes to load, once per set's job: the plan counts it from the
    checkpoint's bytes on disk (sparse files here: nothing is written)."""
    config = make_config(tmp_path, ["A", "B"], budget={"usd": 1000}, plan={"load_gb_per_s": 2})
    for ds in ("A", "B"):
        write_prompts(tmp_path, ds, 4)
    write_providers(tmp_path)
    kimi_like_target(tmp_path / "target")
    for shard in ("model-1.safetensors", "model-2.safetensors"):
        with (tmp_path / "target" / shard).open("wb") as out:
            out.truncate(300 * 10**9)  # a 600 GB checkpoint, as Kimi-K2.5's INT4 one

    text = format_plan(plan_of(tmp_path, config))

    loading = "loading the target in each of 2 jobs: 5 min each at 2 GB/s (plan.load_gb_per_s), 10 min in all"
    assert loading in text
    # The whole run's time: every stage's, one after another, the load included.
    total = text.split("time, in all: about ")[1]
    assert "until the drafter" in total and "loading the target 10 min" in total and "unknown" not in total


def test_the_whole_runs_time_says_at_least_while_a_stage_is_unknown(tmp_path):
    """Before the weights are downloaded their load time is unknown: the sum is a floor, and says so."""
    config = make_config(tmp_path, ["A"], budget={"usd": 1000}, plan={"tokens_per_s_per_request": 5})
    write_prompts(tmp_path, "A", 4)
    write_providers(tmp_path)
    kimi_like_target(tmp_path / "target")

    plan = plan_of(tmp_path, config)

    line = next(line for line in format_plan(plan).splitlines() if line.startswith("time, in all:"))
    assert line.startswith("time, in all: at least ") and "loading the target unknown" in line
    assert "generation " in line and "hidden states " in line and "training " in line


def test_before_the_download_the_targets_published_config_sizes_the_drafter(tmp_path):
    """The real run's target (moonshotai/Kimi-K2.5) is not at target.path before the download: the plan
    sizes the shards, the active parameters and the draft layer from the config the package keeps."""
    config = make_config(tmp_path, ["A"], budget={"usd": 1000})
    config["target"] = {"name": "moonshotai/Kimi-K2.5", "path": str(tmp_path / "not-downloaded")}
    write_prompts(tmp_path, "A", 4)
    write_providers(tmp_path)

    plan = plan_of(tmp_path, config)

    text = format_plan(plan)
    assert plan.hidden_size == 7168 and plan.hours.drafter_parameters == pytest.approx(1.19e9, rel=0.01)
    assert plan.hours.active_parameters == pytest.approx(31.7e9, rel=0.01)  # Moonshot: 32B active
    published = "moonshotai/Kimi-K2.5's published config.json, until"
    assert "x 1.2B draft parameters x drafter.ttt_length" in text and f"(from {published}" in text
    assert "unknown until" in text.split("time, hidden states:")[1]  # the load: no weights yet


@pytest.mark.parametrize(
    ("targets", "then", "hidden", "training"),
    [
        ([], "then a drafter trained on them", True, True),
        (["results/A/hidden.done"], "then the hidden states of A", True, False),
        (["results/A/tokens.json"], "then the token ids of A", False, False),
        (["results/A/responses.jsonl"], "then the answers of A", False, False),
    ],
)
def test_each_kind_of_target_gets_the_sentences_that_fit_it(tmp_path, targets, then, hidden, training):
    config = make_config(tmp_path, ["A", "B"], budget={"usd": 1000})
    for ds in ("A", "B"):
        write_prompts(tmp_path, ds, 4)
    write_providers(tmp_path)
    layout = RunLayout(tmp_path / "results", tmp_path / "prompts")
    argv = ["snakemake", "-n", *[str(tmp_path / target) for target in targets]]
    scope = sets_named_by(argv[2:], config["datasets"], layout)
    goal = goal_of(argv[2:], config["datasets"], layout)
    text = format_plan(spend_plan(config, scope, FINGERPRINT, layout=layout, goal=goal))

    assert text.splitlines()[-1].startswith("In short: $1,000.00 buys every set left")
    assert text.splitlines()[-1].endswith(f", {then}.")
    assert ("drafter" in text.splitlines()[-1]) == training
    assert ("time, hidden states:" in text) == hidden
    assert ("time, training:" in text) == training
    assert "time, generation: about" in text


def test_prices_are_unknown_without_providers_json_or_for_another_model(tmp_path):
    config = make_config(tmp_path, ["A", "B"])
    write_prompts(tmp_path, "A", 2)
    write_prompts(tmp_path, "B", 2)

    plan = plan_of(tmp_path, config)
    assert plan.prices is None and [(s.usd, s.coverage) for s in plan.sets] == [(None, "unknown")] * 2
    assert "price: unknown" in format_plan(plan) and "cannot price: A, B" in format_plan(plan)

    write_providers(tmp_path, model="vendor/other-model")
    assert plan_of(tmp_path, config).prices is None


def test_configured_prices_stand_in_until_providers_json_exists(tmp_path):
    config = make_config(tmp_path, ["A", "B"], budget={"price_per_m_tokens": {"input": 1.0, "output": 4.0}})
    write_prompts(tmp_path, "A", 2)
    plan = plan_of(tmp_path, config)
    assert plan.prices == Prices(1e-6, 4e-6, source="budget.price_per_m_tokens")
    assert by_name(plan)["A"].usd == pytest.approx(2 * 100 * 1e-6 + 2 * 500 * 4e-6)
    # B's prompts are not built: its input tokens are unknown, so its dollars are a floor (outputs only).
    unbuilt = by_name(plan)["B"]
    assert unbuilt.usd_at_least and unbuilt.usd == pytest.approx(40 * 500 * 4e-6)
    # A range: at the per-answer estimate, and with every answer at max_tokens; B's inputs are not in it.
    assert "$0.0800-$0.1600 +input" in format_plan(plan)
    assert "(budget.price_per_m_tokens)" in format_plan(plan)
    write_providers(tmp_path)
    assert plan_of(tmp_path, config).prices.source.endswith("results/providers.json")


def test_disk_counts_four_layers_of_every_token_still_to_extract(tmp_path):
    config = make_config(tmp_path, ["A", "B", "C", "D"])
    target = tmp_path / "target"
    target.mkdir()
    (target / "config.json").write_text(json.dumps({"text_config": {"hidden_size": 8}}))
    per_token = 4 * 8 * 2 + 5  # bfloat16 states, the int32 id and the uint8 mask
    results = tmp_path / "results"
    # A: generated; billed prompt + completion tokens from responses.jsonl (2 x 30).
    write_lines(results / "A" / "responses.jsonl", [record("A-0", 20), record("A-1", 20)])
    # B: tokens built; the exact count from the token file (77).
    write_lines(results / "B" / "responses.jsonl", [record("B-0", 20)])
    save_file({"input_ids": np.zeros(77, dtype=np.int32), "offsets": np.array([0, 77])},
              str(results / "B" / "tokens.safetensors"))
    # C: one answer in the journal (30 tokens), two prompts to go (100 in + 500 out each).
    c_ids = write_prompts(tmp_path, "C", 3)
    write_journal(tmp_path, "C", [record(c_ids[0], 20)])
    # D: finished.
    write_lines(results / "D" / "responses.jsonl", [record("D-0", 20)])
    (results / "D" / "hidden.done").write_text("{}")

    plan = plan_of(tmp_path, config)

    assert [(s.status, s.disk_bytes) for s in plan.sets] == [
        ("extract", 60 * per_token),
        ("extract", 77 * per_token),
        ("generate", 1230 * per_token),
        ("done", None),
    ]
    formula = ("tokens x 4 layers x hidden 8 (the target's config.json) x 2 B (hidden.dtype bfloat16), "
               "with ids and masks: 69 B per token")
    assert formula in format_plan(plan)


def test_disk_follows_the_sample_caps_and_fp8(tmp_path):
    config = make_config(tmp_path, ["A", "C"], hidden={"dtype": "fp8", "max_samples": 1})
    (tmp_path / "target").mkdir()
    (tmp_path / "target" / "config.json").write_text(json.dumps({"hidden_size": 8}))
    per_token = 4 * 8 + 4 * 4 + 5  # fp8 states, a float32 scale per layer, id and mask
    write_lines(tmp_path / "results" / "A" / "responses.jsonl", [record("A-0", 20), record("A-1", 20)])
    write_prompts(tmp_path, "C", 4)  # 4 x (100 in + 500 out), one sample of the four kept
    plan = plan_of(tmp_path, config)
    assert [s.disk_bytes for s in plan.sets] == [30 * per_token, 600 * per_token]
    text = format_plan(plan)
    assert "x 1 B, one float32 scale a layer (hidden.dtype fp8), with ids and masks: 53 B per token" in text
    assert "per set at most 1 samples (hidden.max_samples)" in text
    tokens_cap = make_config(tmp_path, ["A", "C"], hidden={"max_tokens": 500})
    assert [s.disk_bytes for s in plan_of(tmp_path, tokens_cap).sets] == [60 * 69, 500 * 69]


def test_disk_follows_the_group_codes(tmp_path):
    """int3 at a width of 64: 24 B of codes and one 2-byte scale a layer, four layers, id and mask."""
    config = make_config(tmp_path, ["A"], hidden={"dtype": "int3"})
    (tmp_path / "target").mkdir()
    (tmp_path / "target" / "config.json").write_text(json.dumps({"hidden_size": 64}))
    write_prompts(tmp_path, "A", 4)
    text = format_plan(plan_of(tmp_path, config))
    per_token = 4 * (64 * 3 // 8 + 2) + 5
    cost = "x 3 bits, one bfloat16 scale a group (hidden.dtype int3)"
    assert f"{cost}, with ids and masks: {per_token} B per token" in text


def test_hidden_size_is_read_flat_or_nested_and_unknown_without_a_config(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": 576}))
    assert target_hidden_size(tmp_path) == 576
    assert target_hidden_size(tmp_path / "absent") is None


def test_input_tokens_come_from_the_targets_tokenizer_when_it_has_one(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers

    target = tmp_path / "target"
    target.mkdir()
    tokenizer = Tokenizer(models.WordLevel({"[UNK]": 0, "hello": 1}, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.save(str(target / "tokenizer.json"))
    template = (
        "{% for m in messages %}{{ m.content }} {% endfor %}"
        "{% if add_generation_prompt %}go{% endif %}"
    )
    settings = {"chat_template": template, "unk_token": "[UNK]"}
    (target / "tokenizer_config.json").write_text(json.dumps(settings))
    config = make_config(tmp_path, ["A"])
    write_prompts(tmp_path, "A", 3, content="hello big world")  # 3 words + the generation prompt

    plan = plan_of(tmp_path, config)

    assert plan.input_method == "tokenizer" and plan.sets[0].input_tokens == 12
    assert f"counted with {target / 'tokenizer.json'}" in format_plan(plan)


def test_a_finished_run_has_nothing_left_to_buy(tmp_path):
    config = make_config(tmp_path, ["A"])
    write_lines(tmp_path / "results" / "A" / "responses.jsonl", [record("A-0", 20)])
    (tmp_path / "results" / "A" / "hidden.done").write_text("{}")

    assert "nothing left to buy" in format_plan(plan_of(tmp_path, config))


def test_targets_narrow_the_plan_to_the_sets_they_name():
    sets = ["B1", "B2", "B3"]

    def named(*targets: str) -> list[str]:
        return sets_named_by(targets, sets, RunLayout(Path("results"), Path("resources/prompts")))

    assert named() == sets
    assert named("results/B3/hidden.done", "./results/B1/responses.jsonl") == ["B1", "B3"]
    assert named("resources/prompts/B2.jsonl") == []  # building prompts buys nothing
    assert named("results/B2/tokens.safetensors", "results/drafter/model.safetensors") == sets
    assert named("all") == sets
    assert named("results/B2") == sets  # the set's folder itself is none of its files


def test_targets_are_read_against_the_configurations_own_roots():
    sets = ["demo-a", "demo-b"]

    def named(*targets: str) -> list[str]:
        root = Path("results/demo")
        return sets_named_by(targets, sets, RunLayout(root, root / "prompts"))

    assert named("results/demo/demo-b/hidden.done") == ["demo-b"]
    assert named("results/demo/prompts/demo-a.jsonl") == []
    # Another root's file is not one of this configuration's sets: plan them all, as for a rule name.
    assert named("results/demo-a/hidden.done") == sets


def test_the_goal_is_the_furthest_stage_the_sets_files_name():
    sets, layout = ["B1", "B2"], RunLayout(Path("results"), Path("resources/prompts"))

    def goal(*targets: str) -> str:
        return goal_of(targets, sets, layout)

    assert goal("results/B1/responses.jsonl", "results/B2/tokens.json") == "token ids"
    assert goal("results/B1/hidden", "results/B2/responses.summary.json") == "hidden states"
    assert goal("results/B1/.journal", "resources/prompts/B2.jsonl") == "answers"
    # A file inside a member's folder (a shard) is no rule's output, so it names no stage.
    assert goal("results/B1/hidden/shard-00000.safetensors") == "answers"
    # The set's folder itself, another set's file, a drafter file: the whole run.
    for other in ("results/B1", "results/B3/hidden.done", "results/drafter/config.json"):
        assert goal("results/B1/hidden.done", other) == "drafter", other
    assert {kind for kinds, _ in GOALS for kind in kinds} <= set(BUILDERS)


def test_targets_are_read_from_a_snakemake_command_line_only():
    argv = ["/venv/bin/snakemake", "-n", "--workflow-profile", "profiles/local", "results/B5/hidden.done"]
    assert command_line_targets(argv) == ["results/B5/hidden.done"]
    assert command_line_targets(["/x/snakemake/__main__.py", "--cores", "1"]) == []
    assert command_line_targets(["/venv/bin/pytest", "results/B5/hidden.done"]) == []


def test_a_dry_run_of_the_real_config_prints_the_plan_without_a_key(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "OPENROUTER_KEY_FILE"}
    env["HF_HUB_OFFLINE"] = "1"
    command = [sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile"), "--directory", str(tmp_path),
               "--configfile", str(REPO / "config.yaml"), "-n"]
    run = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env)

    assert run.returncode == 0, run.stderr[-2000:]
    plan = run.stderr.split("eaglepipe spend plan")[1]
    assert plan.startswith(" (no request sent, no key read")
    rows = {line.split()[0]: line.split() for line in plan.splitlines() if line.startswith("B")}
    assert list(rows) == [f"B{i}" for i in range(1, 9)]
    assert rows["B3"][1:4] == ["generate", "7,473", "7,473"]
    assert "spend plan" not in run.stdout and not (tmp_path / "results").exists()


@pytest.mark.parametrize("built", [False, True])
def test_the_demos_plan_before_and_after_its_target_exists(tmp_path, model_dir, built):
    """The demo's first plan, before the target_model rule built SmolLM2, sizes its shards with the width
    config/local.yaml states (576), then with the model's own config.json; it counts the demo's prompts
    from its source files, and every sentence says it is the emulator's."""
    base = yaml.safe_load((REPO / "config.yaml").read_text())
    demo = yaml.safe_load((REPO / "config" / "local.yaml").read_text())
    config = {**base, **{key: {**base.get(key, {}), **value} if isinstance(value, dict) and key != "sources"
                         else value for key, value in demo.items()}}
    target = tmp_path / "model"
    if built:
        # Linked, not copied: the weights are 540 MB.
        shutil.copytree(model_dir.resolve(), target, copy_function=os.symlink)
    config["target"] = {**config["target"], "path": str(target)}
    config["sources"] = {
        ds: {**source, "path": str(REPO / source["path"])} for ds, source in demo["sources"].items()
    }
    config = validate_config(config, REPO / "schemas" / "config.schema.yaml")
    layout = RunLayout(tmp_path / "results", tmp_path / "prompts")

    text = format_plan(spend_plan(config, config["datasets"], FINGERPRINT, layout=layout))

    source = "the target's config.json" if built else "target.hidden_size"
    assert f"hidden 576 ({source}) x 3 bits, one bfloat16 scale a group (hidden.dtype int3)" in text
    assert "7,168" not in text
    rows = {line.split()[0]: line.split() for line in text.splitlines() if line.startswith("demo-")}
    assert rows["demo-chat"][2] == "25" and rows["demo-math"][2] == "24"
    assert "time, generation: the local emulator's pace on this machine" in text
    assert "time, hidden states: on the CPU (hidden.device cpu)" in text
    assert "time, in all" not in text  # the demo's whole time is measured, in the README
    in_short = text.splitlines()[-1]
    assert in_short.startswith("In short (the emulator's dollars; nothing real is bought): $1.00 buys ")
    assert in_short.endswith(", then a drafter trained on them.")
    assert "nothing is bought; 'unknown' only means the demo's prompt sets are not built yet." in text

    # Once they are built, no figure is unknown for that reason, and the sentence goes.
    for ds, source in config["sources"].items():
        lines = Path(source["path"]).read_text().splitlines()
        write_lines(layout.prompt_set(ds), [
            {"id": f"{ds}-{i}", **json.loads(line)} for i, line in enumerate(lines) if line.strip()
        ])
    built_text = format_plan(spend_plan(config, config["datasets"], FINGERPRINT, layout=layout))
    assert "nothing is bought." in built_text and "'unknown' only means" not in built_text


def test_a_share_below_one_requests_worst_case_is_named_before_paying(tmp_path):
    # max_tokens 1,000 at the dearest kept output price, $100/M: $0.10 a request at worst.
    config = make_config(tmp_path, ["A", "B"], budget={"usd": 0.15})
    for ds in ("A", "B"):
        write_prompts(tmp_path, ds, 2)
    write_providers(tmp_path)

    text = format_plan(plan_of(tmp_path, config))

    assert "warning: each set's share ($0.0750) is below one request's worst case ($0.1000: " in text
    config["budget"]["usd"] = 0.2
    assert "warning:" not in format_plan(plan_of(tmp_path, config))
