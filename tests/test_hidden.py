"""Hidden-state shards: the right layers, batching that changes nothing, resume from finished and verified
shards after a real kill, fp8 storage, the agreement check, the sample caps and the disk check."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from stage_settings import hidden_settings

from eaglepipe.drafter.data import load_samples, open_hidden_data
from eaglepipe.hidden import HiddenError
from eaglepipe.hidden.backends import CapturedStates
from eaglepipe.hidden.backends.hf import HFBackend
from eaglepipe.hidden.extract import HiddenSettings, check_agreement, extract_hidden
from eaglepipe.hidden.shards import GroupCodes, plan_shards, read_shard_metadata, state_codec
from eaglepipe.hidden.storage import bytes_per_token, select_rows
from eaglepipe.target.architecture import TargetArchitecture
from eaglepipe.target.layer_ids import AuxLayerError, default_aux_layers
from eaglepipe.target.load import load_target

TESTS = os.path.dirname(os.path.abspath(__file__))
ROWS = [[1, 504, 2177, 288, 1345, 30, 2], [1, 9226, 17, 2], [1, 1345, 314, 253, 1565, 28, 30, 2, 7, 9]]


def test_default_layers_follow_eagle3():
    assert default_aux_layers(61) == [1, 29, 57]
    assert default_aux_layers(30) == [1, 14, 26]


def test_plan_shards_keeps_samples_whole():
    offsets = [0, 5, 9, 20, 22, 30]
    plans = plan_shards(offsets, shard_tokens=8)
    assert [(p.first, p.last) for p in plans] == [(0, 2), (2, 3), (3, 5)]
    assert plan_shards([0, 3], shard_tokens=100)[0].last == 1


def write_tokens(directory, rows, prompt_ids=None):
    flat = [t for row in rows for t in row]
    offsets = [0]
    for row in rows:
        offsets.append(offsets[-1] + len(row))
    path = directory / "tokens.safetensors"
    save_file({
        "input_ids": torch.tensor(flat, dtype=torch.int32),
        "loss_mask": torch.tensor([int(i % 2 == 0) for i in range(len(flat))], dtype=torch.uint8),
        "offsets": torch.tensor(offsets, dtype=torch.int64),
        "prompt_len": torch.tensor([3] * len(rows)), "method": torch.zeros(len(rows), dtype=torch.uint8),
    }, str(path))
    ids = prompt_ids or [chr(ord("a") + i) for i in range(len(rows))]
    (directory / "tokens.json").write_text(json.dumps({"prompt_ids": ids}))
    return path


@pytest.fixture
def token_file(tmp_path):
    return write_tokens(tmp_path, ROWS), ROWS


def settings(dtype="float32", backend="hf", **kwargs) -> HiddenSettings:
    return hidden_settings(dtype=dtype, backend=backend, keep_free_gb=kwargs.pop("keep_free_gb", 0), **kwargs)


def extract(token_path, model_dir, out_dir, **kwargs):
    return extract_hidden(token_path, token_path.with_name("tokens.json"), model_dir, out_dir / "hidden",
                          out_dir / "hidden.done", settings(**kwargs))


def test_states_match_a_single_unbatched_forward(tmp_path, model_dir, token_file):
    token_path, rows = token_file
    manifest = extract(token_path, model_dir, tmp_path, shard_tokens=10, batch_tokens=64)
    assert [s["num_samples"] for s in manifest["shards"]] == [2, 1]
    assert manifest["aux_layer_ids"] == [1, 14, 26] and manifest["hidden_size"] == 576
    assert manifest["layer_convention"] == "output" and manifest["final_norm"] == "after"
    assert manifest["backend"] == "hf" and "hidden_states[i + 1]" in manifest["stored"]["aux"]
    model = load_target(model_dir)
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
        assert read_shard_metadata(handle.metadata())["prompt_ids"] == ["a", "b"]


def test_aux_layers_equal_output_hidden_states_exactly_unbatched(tmp_path, model_dir):
    """One sample per forward: the hooks' tensors are the very ones `output_hidden_states` returns."""
    token_path = write_tokens(tmp_path, ROWS[2:])
    extract(token_path, model_dir, tmp_path, batch_tokens=1)
    shard = load_file(str(tmp_path / "hidden" / "shard-00000.safetensors"))
    model = load_target(model_dir)
    with torch.no_grad():
        states = model(torch.tensor(ROWS[2:]), output_hidden_states=True).hidden_states
    assert torch.equal(shard["aux"], torch.cat([states[i + 1][0] for i in (1, 14, 26)], dim=-1))
    assert torch.equal(shard["final"], states[-1][0])


@pytest.mark.parametrize("dtype", ["float32", "int3"])
def test_rerun_reuses_shards_and_a_layer_change_recomputes(tmp_path, model_dir, token_file, caplog, dtype):
    token_path, _ = token_file
    extract(token_path, model_dir, tmp_path, shard_tokens=10, dtype=dtype)
    shard = tmp_path / "hidden" / "shard-00001.safetensors"
    before = shard.stat().st_mtime_ns
    caplog.set_level("INFO")
    extract(token_path, model_dir, tmp_path, shard_tokens=10, dtype=dtype)
    assert shard.stat().st_mtime_ns == before
    assert "2 of 2 shards already written and verified, 0 to compute" in caplog.text
    manifest = extract(token_path, model_dir, tmp_path, shard_tokens=10, aux_layers=[1, 2, 3], dtype=dtype)
    assert shard.stat().st_mtime_ns != before
    assert manifest["aux_layer_ids"] == [1, 2, 3]


@pytest.mark.parametrize("dtype", ["float32", "int3"])
def test_a_shard_that_fails_its_checksum_is_recomputed(tmp_path, model_dir, token_file, caplog, dtype):
    token_path, _ = token_file
    clean = extract(token_path, model_dir, tmp_path, shard_tokens=10, dtype=dtype)
    shard = tmp_path / "hidden" / "shard-00000.safetensors"
    data = bytearray(shard.read_bytes())
    data[-3] ^= 0xFF  # a flipped bit inside the states: the header (and the shard key) still read fine
    shard.write_bytes(bytes(data))
    caplog.set_level("INFO")
    assert extract(token_path, model_dir, tmp_path, shard_tokens=10, dtype=dtype) == clean
    assert "1 of 2 shards already written and verified, 1 to compute" in caplog.text


def test_bad_layers_name_the_config_key(tmp_path, model_dir, token_file):
    with pytest.raises(AuxLayerError, match="hidden.aux_layers.*layers 0..29"):
        extract(token_file[0], model_dir, tmp_path, aux_layers=[1, 2, 30])
    # Layers some engine reads as others (SGLang's DeepSeek-V3/Kimi family shifts them) are refused too.
    with pytest.raises(AuxLayerError, match="hidden.aux_layers.*starting at layer 1"):
        extract(token_file[0], model_dir, tmp_path, aux_layers=[2, 15, 27])


KILL_SCRIPT = """
import sys
from pathlib import Path
sys.path.insert(0, sys.argv[4])
from stage_settings import hidden_settings
from eaglepipe.hidden.extract import extract_hidden
tokens, model, out = map(Path, sys.argv[1:4])
extract_hidden(tokens, tokens.with_name("tokens.json"), model, out / "hidden", out / "hidden.done",
               hidden_settings(dtype="float32", shard_tokens=1, keep_free_gb=0))
"""


@pytest.mark.slow  # subprocesses (a kill, torchrun) or bf16 on the CPU: CI runs it
def test_killed_mid_run_a_rerun_computes_only_the_missing_shards(tmp_path, model_dir, caplog):
    rows = [[1] + [100 + 7 * i + j for j in range(40 + i)] + [2] for i in range(16)]
    token_path = write_tokens(tmp_path, rows, [f"p{i}" for i in range(16)])
    killed, whole = tmp_path / "killed", tmp_path / "whole"
    command = [sys.executable, "-c", KILL_SCRIPT, str(token_path), str(model_dir), str(killed), TESTS]
    child = subprocess.Popen(command)
    deadline = time.monotonic() + 300
    while not (killed / "hidden" / "shard-00002.json").exists():
        assert child.poll() is None and time.monotonic() < deadline, "the extraction ended before the kill"
        time.sleep(0.01)
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    assert not (killed / "hidden.done").exists()
    finished = len(list((killed / "hidden").glob("shard-*.json")))
    assert 3 <= finished < 16

    caplog.set_level("INFO")
    resumed = extract(token_path, model_dir, killed, shard_tokens=1)
    assert f"{finished} of 16 shards already written and verified, {16 - finished} to compute" in caplog.text
    assert resumed == extract(token_path, model_dir, whole, shard_tokens=1)


@pytest.mark.slow  # subprocesses (a kill, torchrun) or bf16 on the CPU: CI runs it
def test_fp8_shards_decode_within_fp8_error_of_float32_ones_and_train_from_them(tmp_path, model_dir,
                                                                                token_file):
    """On the CPU a storage format computes in float32: what differs from float32 shards is fp8's own
    error."""
    token_path, _ = token_file
    full = extract(token_path, model_dir, tmp_path / "float32", dtype="float32")
    fp8 = extract(token_path, model_dir, tmp_path / "fp8", dtype="fp8")
    reference = load_file(str(tmp_path / "float32" / full["shards"][0]["path"]))
    stored = load_file(str(tmp_path / "fp8" / fp8["shards"][0]["path"]))
    assert stored["aux"].dtype == torch.float8_e4m3fn and stored["aux_scale"].shape == (21, 3)
    width = 576
    aux, final = state_codec("fp8", width).decode(stored)
    for decoded, exact, scale in ((aux.view(21, 3, width), reference["aux"].float().view(21, 3, width),
                                   stored["aux_scale"]),
                                  (final.view(21, 1, width), reference["final"].float().view(21, 1, width),
                                   stored["final_scale"])):
        # e4m3 keeps 3 mantissa bits: a relative error of at most 2^-4 on normal values, and an absolute
        # one of at most 2^-10 of the token's scale unit on subnormal ones.
        bound = exact.abs() * 2**-4 + scale.unsqueeze(-1) * 2**-9
        assert bool(((decoded - exact).abs() <= bound).all())
    assert (tmp_path / "fp8" / fp8["shards"][0]["path"]).stat().st_size < 0.3 * (
        tmp_path / "float32" / full["shards"][0]["path"]).stat().st_size
    # The drafter's loader decodes fp8 shards.
    data = open_hidden_data([tmp_path / "fp8" / "hidden.done"], holdout_ids=set())
    [sample] = load_samples([ref for ref in data.samples if ref.prompt_id == "c"], data.codec)
    assert sample.aux.dtype == torch.float32 and torch.equal(sample.aux, aux[11:21])


def test_fp8_codec_keeps_each_token_within_fp8_error():
    values = torch.randn(64, 3 * 32) * torch.logspace(-4, 3, 64).unsqueeze(1)  # tokens of any magnitude
    final = torch.randn(64, 32)
    codec = state_codec("fp8", 32)
    aux, decoded_final = codec.decode(codec.encode(values, final))
    assert bool(((aux - values).abs() <= values.abs() * 2**-4 + values.abs().amax() * 1e-6).all())
    assert float(((decoded_final - final).abs() / final.abs().clamp(min=1e-3)).median()) < 2**-5


@pytest.mark.parametrize("dtype", ["int4", "int3"])
def test_group_codes_shards_hold_a_fifth_and_decode_within_their_step(tmp_path, model_dir, token_file, dtype):
    """What the loader reads back from an int4 / int3 shard is the float32 states up to the quantizer's own
    error (on the CPU they compute in float32), at the bytes the plan counts; training opens them as any
    shard."""
    token_path, _ = token_file
    exact = extract(token_path, model_dir, tmp_path / "float32", dtype="float32")
    packed = extract(token_path, model_dir, tmp_path / dtype, dtype=dtype)
    reference = load_file(str(tmp_path / "float32" / exact["shards"][0]["path"]))
    stored = load_file(str(tmp_path / dtype / packed["shards"][0]["path"]))
    assert stored["aux"].dtype == torch.uint8 and stored["aux_scale"].dtype == torch.bfloat16
    aux, final = state_codec(dtype, 576).decode(stored)
    bound = {"int4": 0.15, "int3": 0.3}[dtype]  # about 0.1 and 0.2 for Gaussian-like groups
    for decoded, want in ((aux, reference["aux"]), (final, reference["final"])):
        assert float((decoded - want).norm() / want.norm()) < bound
    per_token = bytes_per_token(576, dtype)
    # SmolLM2's 576 is tiled by groups of 64 (Kimi-K2.5's 7168 by 128): a little more scale per value.
    assert per_token <= bytes_per_token(576, "bfloat16") / {"int4": 3.7, "int3": 4.8}[dtype]
    tokens = packed["shards"][0]["num_tokens"]
    assert sum(t.numel() * t.element_size() for t in stored.values()) <= per_token * tokens + 8 * (
        packed["shards"][0]["num_samples"] + 1)  # the offsets
    data = open_hidden_data([tmp_path / dtype / "hidden.done"], holdout_ids=set())
    [sample] = load_samples([ref for ref in data.samples if ref.prompt_id == "c"], data.codec)
    assert torch.equal(sample.aux, aux[11:21]) and torch.equal(sample.final, final[11:21])


@pytest.mark.parametrize("bits", [4, 3])
def test_group_codes_pack_every_code_and_turn_outliers_into_their_group(bits):
    codec = GroupCodes(bits, 256)
    codes = torch.randint(0, 2**bits, (5, 256), dtype=torch.uint8)
    assert codec._pack(codes).shape == (5, 256 * bits // 8)
    assert torch.equal(codec._unpack(codec._pack(codes)), codes.long())
    assert torch.allclose(codec.rotation @ codec.rotation, torch.eye(128), atol=1e-6)
    # One channel a thousand times the rest (as a target's hidden states have): turned, its group keeps the
    # error a group without it has, relative to the group's size (about 0.1 in int4, 0.2 in int3; unturned,
    # every other value of that group would come back as half a step of the outlier's scale).
    generator = torch.Generator().manual_seed(0)
    values = torch.randn(64, 3 * 256, generator=generator)
    values[:, 7] *= 1000
    aux, _ = codec.decode(codec.encode(values, torch.randn(64, 256, generator=generator)))
    error = ((aux - values).reshape(64, 6, 128).norm(dim=-1) / values.reshape(64, 6, 128).norm(dim=-1))
    assert float(error[:, 0].median()) < 1.2 * float(error[:, 1:].median())
    assert float(error.max()) < {4: 0.25, 3: 0.5}[bits]


def test_group_codes_refuse_a_width_their_groups_cannot_tile():
    with pytest.raises(HiddenError, match="not a multiple of 8.*bfloat16 or fp8"):
        state_codec("int3", 100)


def test_the_agreement_check_names_the_prompt_whose_ids_the_engine_changed(model_dir):
    backend = HFBackend(hidden_settings(dtype="float32").backend, model_dir, [1, 14, 26])
    expected = torch.tensor(ROWS[0])
    shifted = torch.tensor([2] + ROWS[0][1:])  # an engine that prefilled another first token
    [states] = backend.states([shifted])
    with pytest.raises(HiddenError, match="prompt p7: the engine prefilled other ids .*first at position 0"):
        check_agreement("p7", expected, states, 576)
    [good] = backend.states([expected])
    check_agreement("p7", expected, good, 576)
    cut = CapturedStates(good.prefilled_ids[:-1], good.aux[:-1], good.final[:-1])
    with pytest.raises(HiddenError, match="lengths 6 vs 7"):
        check_agreement("p7", expected, cut, 576)


def test_capped_sets_keep_a_seeded_stable_subset(tmp_path, model_dir):
    ids = [f"q{i}" for i in range(40)]
    lengths = [10 + i for i in range(40)]
    chosen = select_rows(ids, lengths, max_samples=10, max_tokens=None, seed=3)
    assert len(chosen) == 10 and chosen == sorted(chosen)
    assert chosen == select_rows(ids, lengths, max_samples=10, max_tokens=None, seed=3)
    assert chosen != select_rows(ids, lengths, max_samples=10, max_tokens=None, seed=4)
    # Adding prompts keeps every earlier pick that no newcomer outranks.
    grown = select_rows([*ids, "new1", "new2"], [*lengths, 5, 5], max_samples=10, max_tokens=None, seed=3)
    assert len(set(grown) & set(chosen)) >= 8
    under_tokens = select_rows(ids, lengths, max_samples=None, max_tokens=100, seed=0)
    assert sum(lengths[r] for r in under_tokens) <= 100 and len(under_tokens) >= 3

    token_path = write_tokens(tmp_path, ROWS)
    manifest = extract(token_path, model_dir, tmp_path, max_samples=2, seed=1)
    assert manifest["num_samples"] == 2 and manifest["subset"]["of_samples"] == 3
    assert manifest["prompt_ids"] == [["a", "b", "c"][r] for r in select_rows(
        ["a", "b", "c"], [7, 4, 10], max_samples=2, max_tokens=None, seed=1)]


def test_a_disk_too_small_stops_the_job_before_it_computes(tmp_path, model_dir, token_file):
    with pytest.raises(HiddenError, match=r"hidden.keep_free_gb is 1e\+09, but only .* GB are free"):
        extract(token_file[0], model_dir, tmp_path, keep_free_gb=1e9)
    assert not list((tmp_path / "hidden").glob("shard-*"))


def test_the_target_shape_comes_from_the_nested_text_config(model_dir):
    flat = TargetArchitecture.from_dir(model_dir)
    assert (flat.num_layers, flat.hidden_size) == (30, 576)
    kimi = TargetArchitecture.from_config({"model_type": "kimi_k25", "text_config": {
        "model_type": "deepseek_v3", "num_hidden_layers": 61, "hidden_size": 7168, "rms_norm_eps": 1e-6}})
    assert (kimi.num_layers, kimi.hidden_size, kimi.text_model_type) == (61, 7168, "deepseek_v3")
