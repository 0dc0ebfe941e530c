"""One reader of the target's config (eaglepipe.target.architecture), at config level: the real Kimi-K2.5's
nesting, layers, head width, vocabulary, special ids and weight names; the drafter and the disk it implies;
and the check that the serving engines and transformers compute the same model from a config."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from kimi_k25_config import KIMI_K25, KIMI_K25_TEXT
from stage_settings import hidden_settings

from eaglepipe.drafter.export import config_json
from eaglepipe.drafter.model import Eagle3Config, Eagle3Drafter
from eaglepipe.hidden.extract import extract_hidden
from eaglepipe.hidden.storage import bytes_per_token
from eaglepipe.target.architecture import TargetArchitecture, TargetConfigError
from eaglepipe.target.layer_ids import default_aux_layers
from eaglepipe.target.tiny import DEEPSEEK_V3_TINY, KIMI_K25_TINY, target_config

KIMI = TargetArchitecture.from_config(KIMI_K25, "Kimi-K2.5/config.json")


def test_kimi_k25_is_read_through_its_text_config_and_language_model_weights():
    assert (KIMI.nested, KIMI.architecture, KIMI.text_model_type) == (
        True,
        "KimiK25ForConditionalGeneration",
        "kimi_k2",
    )
    assert (KIMI.num_layers, KIMI.hidden_size, KIMI.vocab_size) == (61, 7168, 163840)
    assert (KIMI.bos_token_id, KIMI.eos_token_id, KIMI.pad_token_id) == (163584, 163585, 163839)
    assert (KIMI.embedding_weight, KIMI.lm_head_weight, KIMI.final_norm_weight) == (
        "language_model.model.embed_tokens.weight",
        "language_model.lm_head.weight",
        "language_model.model.norm.weight",
    )
    assert KIMI.uses_mla and KIMI.text_only and not KIMI.tie_word_embeddings
    assert KIMI.rope_theta == 50000.0
    assert KIMI.engine_problems() == []


def test_an_mla_target_gives_the_drafter_its_value_head_width_not_deepseeks_head_dim_key():
    # 7168 / 64 heads would be 112; DeepSeek's `head_dim` key (as transformers writes it) is the rope dim, 64.
    assert KIMI.attention_head_dim == 128
    saved_by_transformers = TargetArchitecture.from_config({**KIMI_K25_TEXT, "head_dim": 64})
    assert saved_by_transformers.attention_head_dim == 128
    tiny = TargetArchitecture.from_config(target_config(KIMI_K25_TINY))
    assert (tiny.hidden_size // tiny.num_attention_heads, tiny.attention_head_dim) == (64, 32)


def test_the_kimi_k25_drafter_at_config_level():
    aux = default_aux_layers(KIMI.num_layers)
    config = Eagle3Config.from_target(KIMI, 32000, aux, "bfloat16")
    assert aux == [1, 29, 57]
    exported = config_json(config)
    assert {
        key: exported[key]
        for key in (
            "hidden_size",
            "num_attention_heads",
            "num_key_value_heads",
            "head_dim",
            "intermediate_size",
            "vocab_size",
            "draft_vocab_size",
            "target_hidden_size",
        )
    } == {
        "hidden_size": 7168,
        "num_attention_heads": 64,
        "num_key_value_heads": 64,
        "head_dim": 128,
        "intermediate_size": 18432,
        "vocab_size": 163840,
        "draft_vocab_size": 32000,
        "target_hidden_size": 7168,
    }
    assert exported["eagle_aux_hidden_state_layer_ids"] == [2, 30, 58]  # vLLM's input-of-layer ids
    assert exported["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 29, 57]
    with torch.device("meta"):
        drafter = Eagle3Drafter(config, torch.empty(163840, 7168))
    trained = sum(p.numel() for name, p in drafter.named_parameters() if name != "embed_tokens.weight")
    hidden, attention, mlp = 7168, 64 * 128, 18432
    expected = (
        3 * hidden * hidden
        + 3 * 2 * hidden * attention
        + attention * hidden
        + 3 * hidden * mlp
        + 4 * hidden
        + 32000 * hidden
    )
    assert trained == expected
    print(f"Kimi-K2.5 drafter: {trained / 1e9:.3f} B trained parameters (bf16 {2 * trained / 1e9:.2f} GB)")


def test_kimi_k25_hidden_states_in_int3_cost_a_fifth_of_bf16_scales_included():
    """Issue 38's bar: at most 11.5 KB a token at Kimi-K2.5's width, every scale, id and mask counted."""
    assert bytes_per_token(KIMI.hidden_size, "int3") == 4 * (7168 * 3 // 8 + 56 * 2) + 5 == 11_205
    assert bytes_per_token(KIMI.hidden_size, "int3") <= bytes_per_token(KIMI.hidden_size, "bfloat16") / 5
    assert bytes_per_token(KIMI.hidden_size, "int4") == 4 * (7168 // 2 + 56 * 2) + 5


def test_kimi_k25_hidden_states_cost_57344_bytes_per_token_in_bf16():
    per_token = bytes_per_token(KIMI.hidden_size, "bfloat16")
    assert per_token - bytes_per_token(1, "bfloat16") == 4 * 7167 * 2  # 3 aux layers + the final one
    assert 4 * KIMI.hidden_size * 2 == 57344


@pytest.mark.parametrize("name", [KIMI_K25_TINY, DEEPSEEK_V3_TINY])
def test_the_tiny_targets_are_read_by_engines_and_transformers_alike(name):
    assert TargetArchitecture.from_config(target_config(name)).engine_problems() == []


def test_a_config_saved_by_transformers_is_another_model_for_the_engines():
    from transformers import DeepseekV3Config

    saved = DeepseekV3Config(hidden_size=64, num_hidden_layers=2, num_attention_heads=2).to_dict()
    problems = TargetArchitecture.from_config(saved).engine_problems()
    assert [p.split(" ")[0] for p in problems] == ["scoring_func", "topk_method"]
    with pytest.raises(TargetConfigError) as error:
        TargetArchitecture.from_config(saved, "my-target/config.json").check_engines_agree()
    line = str(error.value)
    assert "\n" not in line and line.startswith("my-target/config.json:")
    assert '"scoring_func": "sigmoid"' in line and "softmax" in line
    # vLLM's deepseek_v2.py makes the correction bias only for noaux_tc: the checkpoint's then stops loading.
    assert "e_score_correction_bias" in problems[1] and "KeyError" in problems[1]


def test_missing_routing_keys_are_named():
    text = {k: v for k, v in KIMI_K25_TEXT.items() if k not in ("n_group", "routed_scaling_factor")}
    problems = TargetArchitecture.from_config({**KIMI_K25, "text_config": text}).engine_problems()
    assert problems == [
        "text_config.n_group is missing: transformers and vLLM default it differently; write it",
        "text_config.routed_scaling_factor is missing: transformers and vLLM default it differently; "
        "write it",
    ]


def test_an_engine_backend_refuses_such_a_target_before_any_engine_starts(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({**KIMI_K25_TEXT, "scoring_func": None}))
    settings = hidden_settings(target_name="mine", backend="vllm")
    with pytest.raises(TargetConfigError, match="scoring_func is None"):
        extract_hidden(
            tmp_path / "t", tmp_path / "s", tmp_path, tmp_path / "h", tmp_path / "h.done", settings
        )


def test_the_command_line_check_on_a_target_directory(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(KIMI_K25))
    good = subprocess.run(
        [sys.executable, "-m", "eaglepipe.target.architecture", str(tmp_path)], capture_output=True, text=True
    )
    assert good.returncode == 0 and json.loads(good.stdout.split("\n}")[0] + "}")["attention_head_dim"] == 128
    (tmp_path / "config.json").write_text(
        json.dumps({**KIMI_K25, "text_config": {**KIMI_K25_TEXT, "topk_method": "greedy"}})
    )
    bad = subprocess.run(
        [sys.executable, "-m", "eaglepipe.target.architecture", str(tmp_path)], capture_output=True, text=True
    )
    assert bad.returncode == 1 and bad.stderr.count("\n") == 1 and "topk_method is 'greedy'" in bad.stderr
