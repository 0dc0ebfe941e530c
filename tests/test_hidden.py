"""Hidden-state shards: the right layers, batching that changes nothing, and resume from finished shards."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from eaglepipe.hidden.extract import default_aux_layers, extract_hidden, plan_shards
from eaglepipe.target.load import load_target


def test_default_layers_follow_eagle3():
    assert default_aux_layers(61) == [1, 29, 57]
    assert default_aux_layers(30) == [1, 14, 26]


def test_plan_shards_keeps_samples_whole():
    offsets = [0, 5, 9, 20, 22, 30]
    plans = plan_shards(offsets, shard_tokens=8)
    assert [(p.first, p.last) for p in plans] == [(0, 2), (2, 3), (3, 5)]
    assert plan_shards([0, 3], shard_tokens=100)[0].last == 1


@pytest.fixture
def token_file(tmp_path):
    rows = [[1, 504, 2177, 288, 1345, 30, 2], [1, 9226, 17, 2], [1, 1345, 314, 253, 1565, 28, 30, 2, 7, 9]]
    flat = [t for row in rows for t in row]
    offsets = [0]
    for row in rows:
        offsets.append(offsets[-1] + len(row))
    path = tmp_path / "tokens.safetensors"
    save_file({
        "input_ids": torch.tensor(flat, dtype=torch.int32),
        "loss_mask": torch.tensor([int(i % 2 == 0) for i in range(len(flat))], dtype=torch.uint8),
        "offsets": torch.tensor(offsets, dtype=torch.int64),
        "prompt_len": torch.tensor([3, 2, 4]), "method": torch.zeros(3, dtype=torch.uint8),
    }, str(path))
    (tmp_path / "tokens.json").write_text(json.dumps({"prompt_ids": ["a", "b", "c"]}))
    return path, rows


def extract(token_path, model_dir, tmp_path, **kwargs):
    return extract_hidden(token_path, token_path.with_name("tokens.json"), model_dir, tmp_path / "hidden",
                          tmp_path / "hidden.done",
                          target_name="smollm2", dtype="float32", device="cpu", **kwargs)


def test_states_match_a_single_unbatched_forward(tmp_path, model_dir, token_file):
    token_path, rows = token_file
    manifest = extract(token_path, model_dir, tmp_path, shard_tokens=10, batch_tokens=64)
    assert [s["num_samples"] for s in manifest["shards"]] == [2, 1]
    assert manifest["aux_layer_ids"] == [1, 14, 26] and manifest["hidden_size"] == 576
    assert manifest["layer_convention"] == "output" and manifest["final_norm"] == "after"
    model, _ = load_target(model_dir)
    assert manifest["shards"][0]["path"] == "hidden/shard-00000.safetensors"
    first = load_file(str(tmp_path / manifest["shards"][0]["path"]))
    with torch.no_grad():
        alone = model(torch.tensor([rows[1]]), output_hidden_states=True).hidden_states
        logits = model(torch.tensor([rows[1]])).logits
    start, end = first["offsets"][1], first["offsets"][2]
    expected_aux = torch.cat([alone[i + 1][0] for i in (1, 14, 26)], dim=-1)
    torch.testing.assert_close(first["aux"][start:end], expected_aux, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(first["final"][start:end], alone[-1][0], atol=1e-4, rtol=1e-4)
    # "after the final norm": the lm_head applied to the stored state gives the model's logits.
    torch.testing.assert_close(model.lm_head(first["final"][start:end]), logits[0], atol=1e-3, rtol=1e-3)
    with safe_open(str(tmp_path / "hidden" / "shard-00000.safetensors"), "pt") as handle:
        assert json.loads(handle.metadata()["prompt_ids"]) == ["a", "b"]


def test_rerun_reuses_shards_and_a_layer_change_recomputes(tmp_path, model_dir, token_file, caplog):
    token_path, _ = token_file
    extract(token_path, model_dir, tmp_path, shard_tokens=10)
    shard = tmp_path / "hidden" / "shard-00001.safetensors"
    before = shard.stat().st_mtime_ns
    caplog.set_level("INFO")
    extract(token_path, model_dir, tmp_path, shard_tokens=10)
    assert shard.stat().st_mtime_ns == before
    assert caplog.text.count("reused") == 2
    manifest = extract(token_path, model_dir, tmp_path, shard_tokens=10, aux_layers=[0, 1, 2])
    assert shard.stat().st_mtime_ns != before
    assert manifest["aux_layer_ids"] == [0, 1, 2]


def test_bad_layers_name_the_config_key(tmp_path, model_dir, token_file):
    with pytest.raises(ValueError, match="hidden.aux_layers.*layers 0..29"):
        extract(token_file[0], model_dir, tmp_path, aux_layers=[1, 2, 30])
