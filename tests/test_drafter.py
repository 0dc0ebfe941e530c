"""The EAGLE-3 drafter on the real embedded target: vocabulary, forward, data, training, export, eval."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from unittest.mock import ANY

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from stage_settings import eval_settings, train_settings
from transformers import AutoConfig

from eaglepipe.drafter import DrafterError
from eaglepipe.drafter.data import SampleRef, load_samples, open_hidden_data
from eaglepipe.drafter.distributed import train_data_parallel
from eaglepipe.drafter.evaluate import (
    EagleProposer,
    PromptLookupProposer,
    evaluate,
    learning_curve,
    speculative_generate,
    speculative_generate_batch,
    untrained_like,
)
from eaglepipe.drafter.export import (
    TargetReference,
    config_json,
    export_drafter,
    load_exported,
    write_serving_readme,
)
from eaglepipe.drafter.frozen import load_target_embeddings
from eaglepipe.drafter.model import DraftCache, Eagle3Config, Eagle3Drafter
from eaglepipe.drafter.train import (
    SoftCrossEntropy,
    Teacher,
    collate,
    mix_sets,
    shift_left,
    train_drafter,
    ttt_loss,
)
from eaglepipe.drafter.vocab import build_draft_vocab
from eaglepipe.hidden.shards import METADATA_KEY
from eaglepipe.io import file_sha256
from eaglepipe.target.architecture import TargetArchitecture
from eaglepipe.target.chat import render_prompt_ids, stop_token_id
from eaglepipe.target.layer_ids import (
    AuxLayerError,
    aux_layers_as_read,
    check_engines_agree,
    default_aux_layers,
)
from eaglepipe.target.load import load_target, load_tokenizer

CONVERSATIONS = [
    (
        "capital",
        "What is the capital of France?",
        "The capital of France is Paris. Paris is also the largest "
        "city in France and is known for the Eiffel Tower.",
    ),
    (
        "colors",
        "Name three primary colors.",
        "The three primary colors are red, blue and yellow. Mixing "
        "red and blue gives purple, and mixing blue and yellow gives green.",
    ),
    ("count", "Count from one to ten.", "One, two, three, four, five, six, seven, eight, nine, ten."),
    (
        "python",
        "How do I print hello in Python?",
        'In Python you print hello with print("hello"). '
        "The print function writes its argument to the screen.",
    ),
    (
        "water",
        "What is water made of?",
        "Water is made of hydrogen and oxygen. Each water molecule has two "
        "hydrogen atoms and one oxygen atom.",
    ),
    (
        "days",
        "List the days of the week.",
        "The days of the week are Monday, Tuesday, Wednesday, Thursday, Friday, Saturday and Sunday.",
    ),
    (
        "sun",
        "Why is the sun hot?",
        "The sun is hot because of nuclear fusion. In its core, hydrogen fuses "
        "into helium and releases a lot of energy.",
    ),
    (
        "cats",
        "Tell me about cats.",
        "Cats are small furry animals. Cats like to sleep, and cats like to "
        "play. Many people keep cats as pets.",
    ),
]
HELD_OUT = {"sun", "cats"}
EXPECTED_WEIGHTS = {
    "midlayer.input_layernorm.weight": [576],
    "midlayer.hidden_norm.weight": [576],
    "midlayer.self_attn.q_proj.weight": [576, 1152],
    "midlayer.self_attn.k_proj.weight": [192, 1152],
    "midlayer.self_attn.v_proj.weight": [192, 1152],
    "midlayer.self_attn.o_proj.weight": [576, 576],
    "midlayer.post_attention_layernorm.weight": [576],
    "midlayer.mlp.gate_proj.weight": [1536, 576],
    "midlayer.mlp.up_proj.weight": [1536, 576],
    "midlayer.mlp.down_proj.weight": [576, 1536],
    "fc.weight": [576, 1728],
    "norm.weight": [576],
    "lm_head.weight": [256, 576],
    "d2t": [256],
    "t2d": [49152],
}


def write_hidden_set(model, tokenizer, out_dir: Path, aux_layer_ids: list[int], per_shard: int) -> Path:
    """Hidden-state shards and `hidden.done` in the format of docs/formats.md, from the real target."""
    out_dir.mkdir(parents=True, exist_ok=True)
    stop = stop_token_id(tokenizer)
    rows = []
    with torch.no_grad():
        for prompt_id, question, answer in CONVERSATIONS:
            prompt = render_prompt_ids(tokenizer, [{"role": "user", "content": question}])
            completion = tokenizer.encode(answer, add_special_tokens=False) + [stop]
            out = model(torch.tensor([prompt + completion]), output_hidden_states=True)
            rows.append(
                {
                    "prompt_id": prompt_id,
                    "aux": torch.cat([out.hidden_states[i + 1][0] for i in aux_layer_ids], dim=-1),
                    "final": out.hidden_states[-1][0],
                    "input_ids": torch.tensor(prompt + completion, dtype=torch.int32),
                    "loss_mask": torch.tensor([0] * len(prompt) + [1] * len(completion), dtype=torch.uint8),
                }
            )
    entries = []
    for index, first in enumerate(range(0, len(rows), per_shard)):
        part = rows[first : first + per_shard]
        lengths = torch.tensor([0] + [len(r["input_ids"]) for r in part])
        tensors = {
            name: torch.cat([r[name] for r in part]).contiguous()
            for name in ("aux", "final", "input_ids", "loss_mask")
        }
        tensors["offsets"] = lengths.cumsum(0)
        path = out_dir / "hidden" / f"shard-{index:05d}.safetensors"
        path.parent.mkdir(exist_ok=True)
        save_file(
            tensors,
            str(path),
            metadata={
                METADATA_KEY: json.dumps(
                    {"prompt_ids": [r["prompt_id"] for r in part], "aux_layer_ids": aux_layer_ids}
                ),
            },
        )
        entries.append(
            {
                "path": f"hidden/{path.name}",
                "sha256": file_sha256(path),
                "num_samples": len(part),
                "num_tokens": int(lengths.sum()),
            }
        )
    manifest = out_dir / "hidden.done"
    manifest.write_text(
        json.dumps(
            {
                "shards": entries,
                "prompt_ids": [r["prompt_id"] for r in rows],
                "aux_layer_ids": aux_layer_ids,
                "layer_convention": "output",
                "final_norm": "after",
                "hidden_size": model.config.hidden_size,
                "dtype": "float32",
            }
        )
    )
    return manifest


@pytest.fixture(scope="module")
def target(model_dir):
    return load_target(model_dir), load_tokenizer(model_dir)


@pytest.fixture(scope="module")
def aux_layer_ids(target) -> list[int]:
    return default_aux_layers(target[0].config.num_hidden_layers)


@pytest.fixture(scope="module")
def manifest(target, aux_layer_ids, tmp_path_factory) -> Path:
    model, tokenizer = target
    return write_hidden_set(model, tokenizer, tmp_path_factory.mktemp("demo"), aux_layer_ids, per_shard=5)


@pytest.fixture(scope="module")
def trained(manifest, model_dir, tmp_path_factory) -> tuple[Path, dict]:
    out_dir = tmp_path_factory.mktemp("drafter")
    settings = train_settings(
        draft_vocab_size=256, ttt_length=3, lr=2e-3, epochs=12, batch_tokens=2048, warmup_ratio=0.0
    )
    return out_dir, train_drafter([manifest], model_dir, out_dir, holdout_ids=HELD_OUT, settings=settings)


def random_drafter(model_dir: Path, aux_layer_ids: list[int], draft_vocab_size: int = 256) -> Eagle3Drafter:
    config = Eagle3Config.from_target(TargetArchitecture.from_dir(model_dir), draft_vocab_size, aux_layer_ids)
    embed, _ = load_target_embeddings(model_dir)
    drafter = Eagle3Drafter(config, embed)
    counts = torch.arange(config.vocab_size).flip(0)  # lower ids more frequent
    drafter.set_draft_vocab(*build_draft_vocab(counts, config.draft_vocab_size, config.vocab_size))
    return drafter.eval()


def test_draft_vocab_takes_most_frequent_ids_ties_by_id_then_fills_lowest():
    counts = torch.tensor([0, 5, 3, 5, 0, 1])  # ids 6..9 never seen
    d2t, t2d = build_draft_vocab(counts, draft_vocab_size=6, vocab_size=10)
    assert t2d.nonzero().flatten().tolist() == [0, 1, 2, 3, 4, 5]
    d2t, t2d = build_draft_vocab(counts, draft_vocab_size=3, vocab_size=10)
    assert (torch.arange(3) + d2t).tolist() == [1, 2, 3]  # 1 and 3 tie at 5, then 2
    d2t, t2d = build_draft_vocab(counts, draft_vocab_size=5, vocab_size=10)
    assert (torch.arange(5) + d2t).tolist() == [0, 1, 2, 3, 5]  # 0 is the lowest unseen id
    assert d2t.dtype == torch.int64 and t2d.dtype == torch.bool and t2d.sum() == 5
    with pytest.raises(DrafterError, match="beyond the target vocab"):
        build_draft_vocab(torch.ones(11), draft_vocab_size=5, vocab_size=10)


def test_config_from_target_mirrors_the_target(model_dir, aux_layer_ids):
    config = Eagle3Config.from_target(TargetArchitecture.from_dir(model_dir), 100_000, aux_layer_ids)
    assert (config.hidden_size, config.num_attention_heads, config.num_key_value_heads, config.head_dim) == (
        576,
        9,
        3,
        64,
    )
    assert config.rope_theta == 100000.0 and config.draft_vocab_size == 49152  # capped at the target vocab
    assert config.aux_layer_ids == (1, 14, 26)


def test_forward_shapes_and_fc_only_on_the_first_step(model_dir, aux_layer_ids):
    drafter = random_drafter(model_dir, aux_layer_ids)
    fc_calls = []
    drafter.fc.register_forward_hook(lambda *_: fc_calls.append(1))
    cache = DraftCache()
    with torch.no_grad():
        logits, hidden = drafter(torch.tensor([[5, 6, 7, 8]]), torch.randn(1, 4, 3 * 576), cache)
        assert logits.shape == (1, 4, 256) and hidden.shape == (1, 4, 576) and fc_calls == [1]
        logits, hidden = drafter(torch.tensor([[9]]), hidden[:, -1:], cache)
        logits, hidden = drafter(torch.tensor([[10]]), hidden, cache)
    assert logits.shape == (1, 1, 256) and hidden.shape == (1, 1, 576) and fc_calls == [1]
    assert cache.length == 4 and len(cache.chain_keys) == 2


def test_training_time_test_rows_equal_serving_chains(model_dir, aux_layer_ids):
    """Unrolling every row at once (training) computes what a one-row draft chain (serving) computes."""
    torch.manual_seed(0)
    drafter = random_drafter(model_dir, aux_layer_ids)
    length, steps = 9, 3
    ids, aux = torch.randint(0, 49152, (1, length + steps)), torch.randn(1, length, 3 * 576)
    with torch.no_grad():
        cache, hidden, unrolled = DraftCache(), aux, []
        for step in range(steps):
            hidden = drafter.step(ids[:, step : step + length], hidden, cache)
            unrolled.append(hidden)
        for anchor in (0, 4, length - 1):
            cache, split = DraftCache(), anchor // 2
            if split:  # the context arrives in two extensions, as after a verify
                drafter.step(ids[:, :split], aux[:, :split], cache)
            hidden = drafter.step(ids[:, split : anchor + 1], aux[:, split : anchor + 1], cache)[:, -1:]
            torch.testing.assert_close(hidden, unrolled[0][:, anchor : anchor + 1], rtol=1e-5, atol=1e-5)
            for step in range(1, steps):
                hidden = drafter.step(ids[:, anchor + step : anchor + step + 1], hidden, cache)
                expected = unrolled[step][:, anchor : anchor + 1]
                torch.testing.assert_close(hidden, expected, rtol=1e-5, atol=1e-5)


def test_row_t_learns_the_target_distribution_at_t_plus_1(manifest, model_dir, aux_layer_ids):
    """The loss, recomputed from full-vocabulary target logits, for one unroll step."""
    torch.manual_seed(3)
    data = open_hidden_data([manifest], holdout_ids=set())
    drafter = random_drafter(model_dir, aux_layer_ids, draft_vocab_size=64)
    drafter.set_draft_vocab(*build_draft_vocab(data.token_counts, 64, 49152))
    hot = drafter.draft_to_target(torch.arange(64))
    _, lm_head = load_target_embeddings(model_dir)
    sample = load_samples(data.samples[:1], data.codec)[0]
    with torch.no_grad():
        loss, _, counted = ttt_loss(drafter, Teacher(lm_head, hot), collate([sample], torch.device("cpu")), 1)
        ids, aux = sample.input_ids[None], sample.aux[None]
        # row t consumes aux t and token t+1
        logits = drafter.logits(drafter.step(ids[:, 1:], aux[:, :-1], DraftCache()))[0]
        target_logits = sample.final @ lm_head.T
        mask = sample.loss_mask.tolist()
        rows = [
            t
            for t in range(len(mask) - 2)
            if mask[t + 1] and mask[t + 2] and int(target_logits[t + 1].argmax()) in hot.tolist()
        ]
        expected = torch.stack(
            [-(target_logits[t + 1, hot].softmax(-1) * logits[t].log_softmax(-1)).sum() for t in rows]
        ).mean()
    assert 0 < len(rows) < sum(mask) - 1 and counted.tolist() == [len(rows)]
    torch.testing.assert_close(loss, expected)


def test_evaluation_feeds_the_drafter_as_training_does(manifest, model_dir, target, aux_layer_ids):
    """Once the target verified 0..t and produced token t+1, the first draft is what training's row t says."""
    model, _ = target
    torch.manual_seed(2)
    drafter = random_drafter(model_dir, aux_layer_ids)
    opened = open_hidden_data([manifest], holdout_ids=set())
    sample = load_samples(opened.samples[:1], opened.codec)[0]
    ids = sample.input_ids[None]
    training = DraftCache()
    with torch.no_grad():
        training_logits = drafter.logits(drafter.step(shift_left(ids, 1, 0), sample.aux[None], training))
        for t in (len(sample.input_ids) // 2, len(sample.input_ids) - 3):
            states = model(ids[:, : t + 1], output_hidden_states=True).hidden_states
            aux = torch.cat([states[i + 1][0] for i in aux_layer_ids], dim=-1)
            proposer = EagleProposer(drafter)
            drafts = proposer.propose([0], [ids[0, : t + 2].tolist()], [aux], num_steps=1)
            context_keys = training.keys[:, :, : t + 1]  # rows 0..t: aux r with token r+1
            torch.testing.assert_close(proposer.caches[0].keys, context_keys, rtol=1e-4, atol=1e-4)
            assert drafts == [[int(drafter.draft_to_target(training_logits[0, t].argmax()))]]


def test_final_hidden_state_is_after_the_final_norm(target):
    model, _ = target
    last_layer_outputs = []
    handle = model.model.layers[-1].register_forward_hook(lambda _m, _i, out: last_layer_outputs.append(out))
    with torch.no_grad():
        out = model(torch.tensor([[1, 2, 3, 4]]), output_hidden_states=True)
    handle.remove()
    pre_norm = last_layer_outputs[0][0] if isinstance(last_layer_outputs[0], tuple) else last_layer_outputs[0]
    torch.testing.assert_close(out.hidden_states[-1], model.model.norm(pre_norm))
    assert not torch.allclose(out.hidden_states[-1], pre_norm)


def test_data_checks_checksums_and_holds_out(manifest, tmp_path):
    data = open_hidden_data([manifest], holdout_ids=HELD_OUT)
    assert {s.prompt_id for s in data.samples} == {c[0] for c in CONVERSATIONS} - HELD_OUT
    assert sorted(data.held_out) == sorted(HELD_OUT) and data.aux_layer_ids == [1, 14, 26]
    first = load_samples(data.samples[:1], data.codec)[0]
    assert first.aux.shape == (len(first.input_ids), 3 * 576) and first.loss_mask.dtype == torch.bool
    loaded = load_samples(data.samples, data.codec)
    assert int(data.token_counts.sum()) == sum(int(s.loss_mask.sum()) for s in loaded)

    broken = json.loads(manifest.read_text())
    broken["shards"][0]["sha256"] = "0" * 64
    (tmp_path / "hidden").symlink_to(manifest.parent / "hidden")
    (tmp_path / "hidden.done").write_text(json.dumps(broken))
    with pytest.raises(DrafterError, match="shard-00000.safetensors: sha256 differs"):
        open_hidden_data([tmp_path / "hidden.done"], holdout_ids=set())


def test_soft_cross_entropy_gradient():
    probs = torch.softmax(torch.randn(4, 7, dtype=torch.double), -1)
    logits = torch.randn(3, 7, dtype=torch.double, requires_grad=True)
    rows = torch.tensor([2, 0, 2])
    assert torch.autograd.gradcheck(lambda x: SoftCrossEntropy.apply(x, probs, rows), (logits,))
    expected = -(probs[rows] * logits.log_softmax(-1)).sum(-1).mean()
    torch.testing.assert_close(SoftCrossEntropy.apply(logits, probs, rows), expected)


def test_settings_name_the_bad_field():
    with pytest.raises(DrafterError, match="ttt_length"):
        dataclasses.replace(train_settings(), ttt_length=0)


@pytest.mark.slow
def test_training_reduces_the_loss_and_exports(trained, model_dir):
    out_dir, report = trained
    losses = [point["loss"] for point in report["loss_curve"]]
    assert report["steps"] == 12 and losses[-1] < 0.7 * losses[0]
    assert len(report["ttt_accuracy"]) == 3 and all(0 <= a <= 1 for a in report["ttt_accuracy"])
    assert report["held_out_prompt_ids"] == sorted(HELD_OUT) and report["train_samples"] == 6
    assert {p.name for p in out_dir.iterdir()} == {"config.json", "model.safetensors"}


def readme_commands(readme: str, **values: str) -> str:
    """The README's shell blocks as one script, its placeholders (`NAME=/path/on/this/node/...`) set."""
    blocks = readme.split("```")[1::2]
    script = "\n".join(block.strip() for block in blocks)
    for name, value in values.items():
        script = re.sub(rf"^{name}=/path/on/this/node/.*$", f"{name}={value}", script, flags=re.M)
    return script


@pytest.mark.parametrize("local_only", [False, True])
def test_serving_readme_names_the_target_and_its_commands_serve_the_moved_drafter(
    model_dir, aux_layer_ids, tmp_path, local_only
):
    """The engines are given the target's name, never the training node's path, and the drafter wherever it
    was copied: the README's commands, run by bash with the engines' commands recording their arguments."""
    drafter_dir = tmp_path / "training-node" / "drafter"
    export_drafter(random_drafter(model_dir, aux_layer_ids), drafter_dir)
    config = json.loads((drafter_dir / "config.json").read_text())
    target = TargetReference("org/target-model", str(model_dir), local_only)
    write_serving_readme(drafter_dir / "README.md", config, target, num_steps=4)
    readme = (drafter_dir / "README.md").read_text()
    assert str(model_dir) not in readme.split("```", 1)[1]  # in the commands, the name only
    assert ("copy that folder to the serving node too" in readme) is local_only

    moved = tmp_path / "serving-node" / "drafters" / "kimi"
    served_target = "/srv/models/target-model" if local_only else "org/target-model"
    script = readme_commands(readme, DRAFTER=str(moved), TARGET=served_target)
    recorder = (
        'vllm() { printf "%s\\n" vllm "$@" > vllm.args; }\n'
        'python() { printf "%s\\n" "$@" > sglang.args; }'
    )
    run = subprocess.run(
        ["bash", "-euc", f"{recorder}\n{script}"], cwd=tmp_path, capture_output=True, text=True
    )
    assert run.returncode == 0, run.stderr
    vllm = (tmp_path / "vllm.args").read_text().splitlines()
    assert vllm[:3] == ["vllm", "serve", served_target] and vllm[3] == "--speculative-config"
    assert json.loads(vllm[4]) == {"method": "eagle3", "model": str(moved), "num_speculative_tokens": 4}
    sglang = (tmp_path / "sglang.args").read_text().splitlines()
    assert sglang[sglang.index("--model-path") + 1] == served_target
    assert sglang[sglang.index("--speculative-draft-model-path") + 1] == str(moved)
    assert sglang[sglang.index("--speculative-num-steps") + 1] == "4"
    assert sglang[sglang.index("--speculative-num-draft-tokens") + 1] == "5"

    target.write(drafter_dir / "target.json")
    assert TargetReference.read(drafter_dir / "target.json") == target


def test_export_layout_and_fused_reload_reproduce_logits(model_dir, aux_layer_ids, tmp_path):
    torch.manual_seed(1)
    drafter = random_drafter(model_dir, aux_layer_ids)
    export_drafter(drafter, tmp_path)
    with safe_open(str(tmp_path / "model.safetensors"), framework="pt") as tensors:
        names = tensors.keys()
        shapes = {name: tensors.get_slice(name).get_shape() for name in names}
        dtypes = tensors.get_tensor("d2t").dtype, tensors.get_tensor("t2d").dtype
    assert dtypes == (torch.int64, torch.bool)
    assert shapes == EXPECTED_WEIGHTS
    config = json.loads((tmp_path / "config.json").read_text())
    assert config == config_json(drafter.config)
    assert config["architectures"] == ["LlamaForCausalLMEagle3"] and config["tie_word_embeddings"] is False
    assert config["eagle_config"] == {
        "eagle_aux_hidden_state_layer_ids": [1, 14, 26],
        "use_aux_hidden_state": True,
    }
    assert config["eagle_aux_hidden_state_layer_ids"] == [2, 15, 27]  # vLLM's input-of-layer ids
    hf = AutoConfig.from_pretrained(tmp_path)
    assert (hf.model_type, hf.num_hidden_layers, hf.draft_vocab_size, hf.head_dim) == ("llama", 1, 256, 64)

    served = load_exported(tmp_path, model_dir)
    assert hasattr(served.midlayer.self_attn, "qkv_proj") and hasattr(served.midlayer.mlp, "gate_up_proj")
    assert torch.equal(served.d2t, drafter.d2t) and torch.equal(served.t2d, drafter.t2d)
    ids, aux = torch.randint(0, 49152, (1, 6)), torch.randn(1, 6, 3 * 576)
    with torch.no_grad():
        caches = DraftCache(), DraftCache()
        (a, ha), (b, hb) = drafter(ids, aux, caches[0]), served(ids, aux, caches[1])
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
        a, _ = drafter(ids[:, -1:], ha[:, -1:], caches[0])
        b, _ = served(ids[:, -1:], hb[:, -1:], caches[1])
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_every_engine_reads_the_exported_aux_layers_as_trained(model_dir, tmp_path):
    export_drafter(random_drafter(model_dir, [1, 14, 26]), tmp_path)
    readings = aux_layers_as_read(json.loads((tmp_path / "config.json").read_text()))
    assert set(readings) == {"vLLM", "SGLang (Llama family)", "SGLang (DeepSeek-V3/Kimi family)"}
    assert all(layers == [1, 14, 26] for layers in readings.values())
    # Custom layers starting at 1 read the same everywhere; any other first layer shifts in DeepSeek-V3.
    check_engines_agree([1, 5, 20])
    for custom in ([2, 15, 27], [0, 14, 26]):
        with pytest.raises(AuxLayerError, match=r"\(DeepSeek-V3/Kimi family\) would feed the drafter layers"):
            check_engines_agree(custom)
        with pytest.raises(AuxLayerError, match="starting at layer 1"):
            export_drafter(random_drafter(model_dir, custom), tmp_path / "custom")
    assert not (tmp_path / "custom" / "config.json").exists()


def test_loading_refuses_a_config_engines_read_differently(model_dir, tmp_path):
    export_drafter(random_drafter(model_dir, [1, 14, 26]), tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    misread = {**config, "eagle_aux_hidden_state_layer_ids": [1, 14, 26]}  # vLLM: outputs of 0, 13, 25
    (tmp_path / "config.json").write_text(json.dumps(misread))
    with pytest.raises(DrafterError, match="engines would read different aux layers"):
        load_exported(tmp_path, model_dir)


@pytest.mark.slow
def test_speculative_decoding_reproduces_greedy_for_every_method(trained, target, model_dir):
    model, tokenizer = target
    stop = stop_token_id(tokenizer)
    drafter = load_exported(trained[0], model_dir)
    proposers = {
        "eagle3": lambda: EagleProposer(drafter),
        "untrained": lambda: EagleProposer(untrained_like(drafter, seed=0)),
        "prompt_lookup": PromptLookupProposer,
    }
    stops_early = "What is 2+2? Answer with a number only."  # greedy: "2 + 2 = 4" and the stop token
    for question in ("Why is the sun hot?", stops_early):
        prompt = render_prompt_ids(tokenizer, [{"role": "user", "content": question}])
        greedy = model.generate(
            torch.tensor([prompt]), max_new_tokens=24, do_sample=False, eos_token_id=stop, pad_token_id=stop
        )[0, len(prompt) :].tolist()
        assert (greedy[-1] == stop) == (question == stops_early)
        for name, make in proposers.items():
            run = speculative_generate(model, prompt, make(), num_steps=3, max_new_tokens=24, stop_id=stop)
            assert run.tokens == greedy, name
            assert run.verified_tokens >= run.target_forwards >= 1, name


@pytest.mark.slow
def test_batched_rows_verify_exactly_as_one_prompt_at_a_time(trained, target, model_dir):
    """Rows of different lengths that accept different drafts and stop at different rounds share forwards."""
    model, tokenizer = target
    stop = stop_token_id(tokenizer)
    drafter = load_exported(trained[0], model_dir)
    questions = [
        "Why is the sun hot?",
        "What is 2+2? Answer with a number only.",
        "Tell me about cats.",
        "Count from one to ten, then list the days of the week.",
    ]
    prompts = [render_prompt_ids(tokenizer, [{"role": "user", "content": q}]) for q in questions]
    assert len({len(p) for p in prompts}) == len(prompts)
    for make in (lambda: EagleProposer(drafter), PromptLookupProposer):
        alone = [
            speculative_generate(model, p, make(), num_steps=3, max_new_tokens=20, stop_id=stop)
            for p in prompts
        ]
        batched = speculative_generate_batch(
            model, prompts, [make() for _ in prompts], num_steps=3, max_new_tokens=20, stop_id=stop
        )
        assert batched == alone
        shared = make()  # one proposer for every row, as the evaluation runs a method: packed drafter steps
        assert (
            speculative_generate_batch(
                model, prompts, [shared] * len(prompts), num_steps=3, max_new_tokens=20, stop_id=stop
            )
            == alone
        )
        assert len({run.target_forwards for run in alone}) > 1  # the rows really finish at different rounds
        assert any(run.accepted_drafts for run in alone)


@pytest.mark.slow
def test_evaluate_reports_every_method(trained, model_dir, target):
    _, tokenizer = target
    questions = ["Count from one to five.", "Why is the sun hot?"]
    prompts = [render_prompt_ids(tokenizer, [{"role": "user", "content": q}]) for q in questions]
    report = evaluate(
        trained[0],
        model_dir,
        prompts,
        eval_settings(max_new_tokens=12, batch_size=2),
        prompt_ids=["count", "sun"],
        prompt_sets=["a", "b"],
    )
    for name in ("eagle3", "eagle3_untrained", "prompt_lookup"):
        method = report["methods"][name]
        assert method["acceptance_length"] >= 1.0 and method["tokens"] >= method["target_forwards"] >= 1
        assert sum(p["tokens"] for p in method["per_prompt"]) == method["tokens"]
        assert method["accepted_drafts"] == sum(method["accepted_per_position"])
        assert method["acceptance_rate_per_position"] == [
            round(a / method["target_forwards"], 4) for a in method["accepted_per_position"]
        ]
        for pid, ds, figures in zip(("count", "sun"), ("a", "b"), method["per_prompt"], strict=True):
            assert (figures.pop("prompt_id"), figures.pop("set")) == (pid, ds)
            assert report["per_set"][ds][name] == figures
    assert report["prompts"] == [{"id": "count", "set": "a"}, {"id": "sun", "set": "b"}]
    assert report["k"] == 3 and report["engine"].startswith("eaglepipe draft-and-verify loop")
    assert report["held_out_prompts"] == 2 and report["outputs_identical_across_methods"] is True
    with pytest.raises(DrafterError, match="topk 1"):
        evaluate(trained[0], model_dir, prompts, dataclasses.replace(eval_settings(), topk=2))


@pytest.mark.slow
def test_learning_curve_measures_the_kept_drafters_as_evaluate_does(manifest, model_dir, target, tmp_path):
    """Drafters kept at evenly spaced steps; the curve's last point is the final drafter, measured exactly as
    eval.json measures it, after an untrained point at 0 tokens; prompt lookup beside them."""
    settings = train_settings(
        draft_vocab_size=256, ttt_length=2, lr=2e-3, epochs=3, batch_tokens=1024, curve_points=3
    )
    out = tmp_path / "drafter"
    report = train_drafter(
        [manifest], model_dir, out, holdout_ids=HELD_OUT, settings=settings,
        checkpoint_dir=tmp_path / "ckpt", snapshot_dir=tmp_path / "snapshots",
    )
    _, tokenizer = target
    prompts = [render_prompt_ids(tokenizer, [{"role": "user", "content": "Count from one to five."}])]
    curve = learning_curve(tmp_path / "snapshots", out, model_dir, prompts, eval_settings(max_new_tokens=10))
    steps = [point["step"] for point in curve["points"]]
    seen = [point["tokens_seen"] for point in curve["points"]]
    assert len(steps) == 4 and steps[0] == 0 and steps[-1] == report["steps"] and steps == sorted(set(steps))
    assert seen[0] == 0 and seen[-1] == report["tokens_seen"] and seen == sorted(set(seen))
    measured = evaluate(out, model_dir, prompts, eval_settings(max_new_tokens=10))["methods"]

    def figures(point: dict) -> dict:
        return {k: v for k, v in point.items() if k not in ("step", "tokens_seen", "seconds", "per_prompt")}

    assert figures(curve["points"][-1]) == figures(measured["eagle3"])
    assert figures(curve["points"][0]) == figures(measured["eagle3_untrained"])
    assert curve["prompt_lookup"] == figures(measured["prompt_lookup"]) and curve["held_out_prompts"] == 1
    none_kept = train_settings(draft_vocab_size=256, ttt_length=2, epochs=1, batch_tokens=1024, max_steps=1)
    train_drafter([manifest], model_dir, out, holdout_ids=HELD_OUT, settings=none_kept,
                  snapshot_dir=tmp_path / "none")
    assert json.loads((tmp_path / "none" / "index.json").read_text()) == {"points": []}
    with pytest.raises(DrafterError, match="drafter.curve_points"):
        learning_curve(tmp_path / "none", out, model_dir, prompts, eval_settings())


RESUMABLE_TRAINING = """
import logging, sys
sys.path.insert(0, sys.argv[5])
from stage_settings import train_settings
from pathlib import Path
from eaglepipe.drafter.train import train_drafter
logging.basicConfig(level=logging.INFO)
manifest, target, out, checkpoints = map(Path, sys.argv[1:5])
settings = train_settings(draft_vocab_size=256, ttt_length=3, lr=2e-3, epochs=6, batch_tokens=512,
                          warmup_ratio=0.1, checkpoint_every=3, curve_points=4)
report = train_drafter([manifest], target, out, holdout_ids={"sun", "cats"}, settings=settings,
                       checkpoint_dir=checkpoints, snapshot_dir=out / "snapshots")
print(report["steps"], report["resumed_from_step"])
"""


def train_in_a_process(manifest: Path, model_dir: Path, out: Path, checkpoints: Path) -> subprocess.Popen:
    paths = [str(manifest), str(model_dir), str(out), str(checkpoints), str(Path(__file__).resolve().parent)]
    return subprocess.Popen([sys.executable, "-c", RESUMABLE_TRAINING, *paths], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)


@pytest.mark.slow  # subprocesses (a kill, torchrun) or bf16 on the CPU: CI runs it
def test_a_sigkilled_training_resumes_and_ends_with_the_uninterrupted_weights(manifest, model_dir, tmp_path):
    """Killed after a checkpoint, the rerun continues from it (model, optimizer, schedule, data order, RNG)
    and exports exactly the weights of a run that was never stopped, learning-curve snapshots included."""
    checkpoints = tmp_path / "checkpoints"
    killed = train_in_a_process(manifest, model_dir, tmp_path / "killed", checkpoints)
    deadline = time.monotonic() + 600
    while not (checkpoints / "latest.pt").exists():
        assert killed.poll() is None and time.monotonic() < deadline, "training ended before a checkpoint"
        time.sleep(0.05)
    os.kill(killed.pid, signal.SIGKILL)
    killed.wait()
    assert not (tmp_path / "killed" / "model.safetensors").exists()

    rerun = train_in_a_process(manifest, model_dir, tmp_path / "killed", checkpoints)
    resumed, _ = rerun.communicate(timeout=900)
    steps, resumed_from = resumed.split()
    assert resumed_from != "None" and 3 <= int(resumed_from) < int(steps)
    assert not (checkpoints / "latest.pt").exists()  # removed once the drafter is exported
    whole, _ = train_in_a_process(manifest, model_dir, tmp_path / "whole", tmp_path / "other").communicate(
        timeout=900)
    assert whole.split() == [steps, "None"]
    got = load_file(str(tmp_path / "killed" / "model.safetensors"))
    want = load_file(str(tmp_path / "whole" / "model.safetensors"))
    assert got.keys() == want.keys() and all(torch.equal(got[name], want[name]) for name in want)
    index = json.loads((tmp_path / "killed" / "snapshots" / "index.json").read_text())
    assert index == json.loads((tmp_path / "whole" / "snapshots" / "index.json").read_text())
    assert len(index["points"]) == 4
    assert index["points"][-1] == {"step": int(steps), "tokens_seen": ANY, "dir": None}
    for point in index["points"][:-1]:
        got = load_file(str(tmp_path / "killed" / "snapshots" / point["dir"] / "model.safetensors"))
        want = load_file(str(tmp_path / "whole" / "snapshots" / point["dir"] / "model.safetensors"))
        assert all(torch.equal(got[name], want[name]) for name in want)
    assert not (checkpoints / "snapshots").exists()


def test_a_checkpoint_of_another_training_is_not_resumed(manifest, model_dir, tmp_path, caplog):
    first = train_settings(
        draft_vocab_size=256, ttt_length=2, epochs=1, batch_tokens=512, max_steps=2, checkpoint_every=1
    )
    from eaglepipe.drafter.checkpoint import save_checkpoint

    save_checkpoint(tmp_path / "ckpt", {"fingerprint": "another training", "step": 1})
    caplog.set_level("INFO")
    report = train_drafter(
        [manifest],
        model_dir,
        tmp_path / "out",
        holdout_ids=HELD_OUT,
        settings=first,
        checkpoint_dir=tmp_path / "ckpt",
    )
    assert report["resumed_from_step"] is None and "another training's" in caplog.text
    assert not (tmp_path / "ckpt" / "latest.pt").exists()  # replaced by this training's, then removed


@pytest.mark.slow  # subprocesses (a kill, torchrun) or bf16 on the CPU: CI runs it
def test_two_data_parallel_ranks_train_as_one_process_accumulating_two_batches(manifest, model_dir, tmp_path):
    """torchrun with 2 CPU ranks (gloo): each step's gradients averaged over the ranks equal one process's
    accumulated over the same two batches, so the runs agree up to float summation order."""
    settings = train_settings(draft_vocab_size=256, ttt_length=2, lr=2e-3, epochs=3, batch_tokens=128,
                              warmup_ratio=0.0)
    alone = train_drafter([manifest], model_dir, tmp_path / "one", holdout_ids=HELD_OUT,
                          settings=dataclasses.replace(settings, batches_per_step=2))
    ranks = train_data_parallel(2, [manifest], model_dir, tmp_path / "two", holdout_ids=HELD_OUT,
                                settings=settings)
    assert (alone["data_parallel_ranks"], ranks["data_parallel_ranks"]) == (1, 2)
    assert ranks["steps"] == alone["steps"] >= 3 and ranks["tokens_seen"] == alone["tokens_seen"]
    curve = [point["loss"] for point in alone["loss_curve"]]
    assert [point["loss"] for point in ranks["loss_curve"]] == pytest.approx(curve, rel=1e-3)
    one, two = load_file(str(tmp_path / "one" / "model.safetensors")), load_file(
        str(tmp_path / "two" / "model.safetensors"))
    for name in one:
        torch.testing.assert_close(two[name], one[name], rtol=1e-3, atol=1e-4)


def test_set_weights_repeat_or_subsample_each_set_and_name_unknown_sets(manifest, model_dir, tmp_path):
    refs = [SampleRef(f"a{i}", Path("a"), 0, 1, source=0) for i in range(4)] + [
        SampleRef(f"b{i}", Path("b"), 0, 1, source=1) for i in range(6)]
    mixed = mix_sets(refs, [2.0, 0.5], seed=0)
    assert [r.prompt_id for r in mixed[:8]] == [f"a{i}" for i in range(4)] * 2
    half = mixed[8:]
    assert len(half) == 3 and {r.prompt_id for r in half} < {f"b{i}" for i in range(6)}
    assert mix_sets(refs, [2.0, 0.5], seed=0) == mixed and mix_sets(refs, [0.0, 1.0], seed=0) == refs[4:]

    settings = train_settings(draft_vocab_size=256, ttt_length=2, epochs=1, batch_tokens=512, max_steps=1)
    plain = train_drafter([manifest], model_dir, tmp_path / "plain", holdout_ids=HELD_OUT, settings=settings,
                          set_names=["demo"])
    twice = dataclasses.replace(settings, set_weights={"demo": 2.0})
    doubled = train_drafter([manifest], model_dir, tmp_path / "doubled", holdout_ids=HELD_OUT, settings=twice,
                            set_names=["demo"])
    assert doubled["train_samples_by_set"] == {"demo": 2 * plain["train_samples_by_set"]["demo"]}
    with pytest.raises(DrafterError, match=r"drafter.set_weights names \['B9'\], not sets of this run"):
        train_drafter([manifest], model_dir, tmp_path / "x", holdout_ids=HELD_OUT, set_names=["demo"],
                      settings=dataclasses.replace(settings, set_weights={"B9": 1.0}))
