"""Token stage on the embedded SmolLM2 (ChatML): rendered prompt + completion, loss mask, server ids checked,
billed counts compared, per-sample methods and flags, the server's prompt ids and the round-trip gate."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
from safetensors.torch import load_file
from stage_settings import token_settings

from eaglepipe.figures.data import RunOutputs, SetOutputs
from eaglepipe.figures.summary import run_table
from eaglepipe.target.chat import render_prompt_ids, stop_token_id
from eaglepipe.target.load import load_target, load_tokenizer
from eaglepipe.tokens.build import TokensError, build_tokens
from eaglepipe.tokens.methods import Flag, Method
from eaglepipe.tokens.probe import usability_probe

PROMPTS = [
    {"id": "p-greet", "messages": [{"role": "user", "content": "Say hello to Ada."}]},
    {"id": "p-math", "messages": [{"role": "system", "content": "Be brief."},
                                  {"role": "user", "content": "What is 12 times 11?"}]},
    {"id": "p-tool", "messages": [{"role": "user", "content": "Weather in Oslo?"}],
     "tools": [{"type": "function", "function": {"name": "weather", "parameters": {"type": "object"}}}]},
]


@pytest.fixture(scope="module")
def greedy(model_dir):
    """Real greedy completions of the target, as a server would return them."""
    model, tokenizer = load_target(model_dir), load_tokenizer(model_dir)
    stop = stop_token_id(tokenizer)
    answers = {}
    for prompt in PROMPTS:
        ids = render_prompt_ids(tokenizer, prompt["messages"], prompt.get("tools"))
        out = model.generate(torch.tensor([ids]), max_new_tokens=12, do_sample=False)[0, len(ids):].tolist()
        stopped = stop in out
        completion = out[: out.index(stop)] if stopped else out
        answers[prompt["id"]] = (len(ids), completion, stopped)
    return tokenizer, answers


def record(pid, tokenizer, answers, *, with_ids=True, billed_delta=0):
    prompt_len, ids, stopped = answers[pid]
    response = {
        "content": tokenizer.decode(ids), "reasoning": None, "tool_calls": None,
        "finish_reason": "stop" if stopped else "length",
    }
    if with_ids:
        response["token_ids"] = ids
    usage = {"prompt_tokens": prompt_len, "completion_tokens": len(ids) + stopped + billed_delta, "cost": 0.0}
    return {"prompt_id": pid, "response": response, "usage": usage}


def write(tmp_path, records):
    (tmp_path / "prompts.jsonl").write_text("".join(json.dumps(p) + "\n" for p in PROMPTS))
    (tmp_path / "responses.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return tmp_path / "prompts.jsonl", tmp_path / "responses.jsonl"


def run(tmp_path, model_dir, records, **settings):
    prompts, responses = write(tmp_path, records)
    return build_tokens(prompts, responses, model_dir, tmp_path / "tokens.safetensors",
                        tmp_path / "tokens.json", token_settings(**settings))


def test_rows_masks_and_methods(tmp_path, model_dir, greedy):
    tokenizer, answers = greedy
    records = [record("p-greet", tokenizer, answers), record("p-math", tokenizer, answers, with_ids=False),
               record("p-tool", tokenizer, answers)]
    stats = run(tmp_path, model_dir, records)
    tensors = load_file(str(tmp_path / "tokens.safetensors"))
    assert stats["prompt_ids"] == ["p-greet", "p-math", "p-tool"]
    assert json.loads((tmp_path / "tokens.json").read_text()) == stats
    offsets, prompt_len = tensors["offsets"].tolist(), tensors["prompt_len"].tolist()
    for row, pid in enumerate(stats["prompt_ids"]):
        billed_prompt, completion, stopped = answers[pid]
        seq = tensors["input_ids"][offsets[row]:offsets[row + 1]].tolist()
        mask = tensors["loss_mask"][offsets[row]:offsets[row + 1]].tolist()
        assert prompt_len[row] == billed_prompt
        assert seq[prompt_len[row]:] == completion + ([stop_token_id(tokenizer)] if stopped else [])
        assert mask == [0] * prompt_len[row] + [1] * (len(seq) - prompt_len[row])
    assert tensors["method"].tolist()[0] == Method.SERVER_IDS
    assert stats["counts"]["prompt_count_mismatches"] == 0
    assert stats["billed"]["relative_difference"] == 0
    truncated = [not answers[pid][2] for pid in stats["prompt_ids"]]
    assert [bool(f & Flag.TRUNCATED) for f in tensors["flags"].tolist()] == truncated


def test_a_count_miss_only_the_split_can_explain_is_kept(tmp_path, model_dir, greedy):
    """One text then the stop: nothing in the answer's structure has another reading, so a bill two over
    the canonical rebuild can only mean the model split its text otherwise (segmentation only): trained on
    by default, with its yield, and dropped when the config says so."""
    tokenizer, answers = greedy
    records = [record("p-greet", tokenizer, answers, with_ids=False, billed_delta=2),
               record("p-math", tokenizer, answers)]
    kept = run(tmp_path, model_dir, records)
    assert kept["prompt_ids"] == ["p-greet", "p-math"]
    assert kept["counts"]["by_method"] == {"rebuilt_segmentation_only": 1, "server_ids": 1}
    assert kept["billed"]["rebuilt_minus_billed_histogram"] == {"-2": 1, "0": 1}
    greet = records[0]["usage"]["completion_tokens"]
    assert kept["yield"]["trained_tokens"] == kept["yield"]["bought_tokens"]
    assert kept["yield"]["trained_tokens_by_method"]["rebuilt_segmentation_only"] == greet
    dropped = run(tmp_path, model_dir, records, on_segmentation="drop")
    assert dropped["prompt_ids"] == ["p-math"] and dropped["counts"]["dropped"] == {"segmentation_only": 1}
    assert dropped["yield"]["dropped"] == {"segmentation_only": {"answers": 1, "tokens": greet, "usd": 0.0}}
    trained = 1 - greet / dropped["yield"]["bought_tokens"]
    assert dropped["yield"]["trained_share"] == pytest.approx(trained, abs=1e-6)


def test_a_count_miss_with_structure_in_doubt_is_dropped_or_kept(tmp_path, model_dir, greedy):
    """A special token's text inside the answer (an engine may have dropped the special id it stood for)
    puts its structure in doubt: a count miss is then off by k, dropped unless the config keeps it."""
    tokenizer, answers = greedy
    marked = record("p-greet", tokenizer, answers, with_ids=False, billed_delta=2)
    marked["response"]["content"] += " <|im_start|>"
    marked["usage"]["completion_tokens"] += len(tokenizer.encode(" <|im_start|>", add_special_tokens=False))
    records = [marked, record("p-math", tokenizer, answers)]
    dropped = run(tmp_path, model_dir, records)
    assert dropped["prompt_ids"] == ["p-math"]
    assert dropped["counts"]["dropped"] == {"completion_count_mismatch": 1}
    assert dropped["counts"]["by_method"] == {"rebuilt_off_by_k": 1, "server_ids": 1}
    kept = run(tmp_path, model_dir, records, on_mismatch="keep")
    assert kept["prompt_ids"] == ["p-greet", "p-math"]


def test_a_provider_that_adds_a_system_prompt_is_flagged(tmp_path, model_dir, greedy):
    tokenizer, answers = greedy
    padded = record("p-math", tokenizer, answers, with_ids=False)
    padded["usage"]["prompt_tokens"] += 7
    stats = run(tmp_path, model_dir, [padded, record("p-greet", tokenizer, answers, with_ids=False)])
    assert stats["prompt"]["count_mismatches"] == 1
    assert stats["prompt"]["rebuilt_minus_billed_histogram"] == {"-7": 1, "0": 1}
    assert stats["prompt_ids"] == ["p-math", "p-greet"]  # a prompt mismatch alone drops nothing


def test_server_ids_that_do_not_decode_to_the_text_are_not_trusted(tmp_path, model_dir, greedy):
    tokenizer, answers = greedy
    bad = record("p-greet", tokenizer, answers)
    bad["response"]["token_ids"] = bad["response"]["token_ids"][::-1]
    stats = run(tmp_path, model_dir, [bad])
    assert "server_ids" not in stats["counts"]["by_method"]
    assert stats["counts"]["flags"]["server_ids_rejected"] == 1


def split_one_token(tokenizer, ids):
    """(position, ids) with the first token that two vocabulary tokens spell split into them: the same text,
    ids BPE would not give."""
    for position, token_id in enumerate(ids):
        piece = tokenizer.convert_ids_to_tokens(token_id)
        for cut in range(1, len(piece)):
            halves = [piece[:cut], piece[cut:]]
            parts = tokenizer.convert_tokens_to_ids(halves)
            if tokenizer.convert_ids_to_tokens(parts) == halves:
                return position, ids[:position] + parts + ids[position + 1:]
    raise AssertionError("no token of the answer splits into two tokens")


def test_the_round_trip_gate_finds_ids_the_text_alone_does_not_give(tmp_path, model_dir, greedy):
    tokenizer, answers = greedy
    split = record("p-greet", tokenizer, answers)
    position, split["response"]["token_ids"] = split_one_token(tokenizer, split["response"]["token_ids"])
    split["usage"]["completion_tokens"] += 1  # billed as generated
    stats = run(tmp_path, model_dir, [split, record("p-math", tokenizer, answers)])
    tensors = load_file(str(tmp_path / "tokens.safetensors"))
    _, completion, stopped = answers["p-greet"]
    gate = stats["round_trip"]
    assert {k: gate[k] for k in ("samples", "exact", "count_matched", "off")} == {
        "samples": 2, "exact": 1, "count_matched": 0, "off": 1}
    assert gate["misses"] == [{
        "prompt_id": "p-greet", "provider": "unknown", "kind": "off", "truth": "segmentation",
        "first_difference": position, "server_length": len(completion) + 1 + stopped,
        "rebuilt_length": len(completion) + stopped, "rebuilt_method": "rebuilt_segmentation_only"}]
    # The split alone differs, and the text-only rebuild said so: its label's precision is measured here.
    assert gate["segmentation_only"] == {"labelled": 1, "truly_segmentation": 1, "precision": 1.0,
                                         "dropped_special": 0, "truly_segmentation_misses": 1, "recall": 1.0}
    end = tensors["offsets"].tolist()[1]
    trained = tensors["input_ids"][tensors["prompt_len"].tolist()[0]:end].tolist()
    assert trained[: len(split["response"]["token_ids"])] == split["response"]["token_ids"]  # the server's
    table = run_table(RunOutputs([SetOutputs("gated", tokens=stats), SetOutputs("text-only", tokens={})]))
    rows = {line.split()[0]: line for line in table.splitlines()[2:4]}
    assert rows["gated"].endswith("1/2 exact, 1 off") and rows["text-only"].endswith(" -")


def test_server_prompt_ids_that_differ_are_flagged_and_trained_on(tmp_path, model_dir, greedy):
    tokenizer, answers = greedy
    records = [record("p-greet", tokenizer, answers), record("p-math", tokenizer, answers)]
    rendered = [render_prompt_ids(tokenizer, p["messages"], p.get("tools")) for p in PROMPTS[:2]]
    changed = [*rendered[1][:2], rendered[1][2] + 1, *rendered[1][3:]]
    records[0]["response"]["prompt_token_ids"] = rendered[0]
    records[1]["response"]["prompt_token_ids"] = changed
    stats = run(tmp_path, model_dir, records)
    tensors = load_file(str(tmp_path / "tokens.safetensors"))
    assert stats["prompt"]["server_ids"] == {
        "samples": 2, "matched": 1, "mismatched": 1,
        "mismatches": [{"prompt_id": "p-math", "provider": "unknown", "first_difference": 2,
                        "server_length": len(changed), "rendered_length": len(rendered[1])}]}
    assert stats["counts"]["flags"]["prompt_server_ids_mismatch"] == 1
    assert [bool(f & Flag.PROMPT_SERVER_IDS_MISMATCH) for f in tensors["flags"].tolist()] == [False, True]
    start = tensors["offsets"].tolist()[1]
    assert tensors["input_ids"][start:start + len(changed)].tolist() == changed


def test_stale_responses_stop_with_one_line(tmp_path, model_dir, greedy):
    tokenizer, answers = greedy
    stale = record("p-greet", tokenizer, answers) | {"prompt_id": "gone"}
    with pytest.raises(TokensError, match="prompt id gone is not in .*rerun generation"):
        run(tmp_path, model_dir, [stale])


def test_the_usability_probe_gives_the_same_verdicts_from_many_threads_at_once(model_dir):
    """Generation runs the probe in worker threads, several answers at once: sound answers checked
    together must stay sound (a race once made them fail as prompt_without_generation_prompt)."""
    probe = usability_probe(model_dir)
    assert probe is not None
    prompts = [
        {"id": f"p{n}", "messages": [{"role": "user", "content": f"Why is {n} * {n} = {n * n}?"}]}
        for n in range(24)
    ]
    records = [
        {
            "prompt_id": prompt["id"],
            "request": {"model": "local/smollm2-135m-instruct"},
            "response": {"content": f"Because {n} times {n} is {n * n}.", "reasoning": None, "tool_calls": [],
                         "finish_reason": "length"},
            "provider": "Chutes",
            "usage": {"prompt_tokens": 40, "completion_tokens": 12},
        }
        for n, prompt in enumerate(prompts)
    ]
    pairs = list(zip(prompts, records, strict=True)) * 4
    assert [probe(prompt, record) for prompt, record in pairs] == [None] * len(pairs)
    with ThreadPoolExecutor(8) as pool:
        verdicts = list(pool.map(lambda pair: probe(*pair), pairs))
    assert verdicts == [None] * len(pairs)
