"""`source: import`: a file of finished conversations becomes the set's responses.jsonl, matched to prompts
by id or by content, and the token stage turns it into rows on the embedded SmolLM2."""

from __future__ import annotations

import hashlib
import json
import logging

import pytest
from safetensors.torch import load_file
from stage_settings import token_settings

from eaglepipe.answers.imported import AnswerImportError, import_answers
from eaglepipe.figures.data import load_run
from eaglepipe.figures.summary import run_table
from eaglepipe.target.chat import render_prompt_ids, stop_token_id
from eaglepipe.target.load import load_tokenizer
from eaglepipe.tokens.build import build_tokens
from eaglepipe.tokens.methods import Method

WEATHER = {"type": "function", "function": {"name": "weather", "parameters": {"type": "object"}}}
PROMPTS = [
    {"id": "p-greet", "messages": [{"role": "user", "content": "Say hello to Ada."}]},
    {"id": "p-math", "messages": [{"role": "system", "content": "Be brief."},
                                  {"role": "user", "content": "What is 12 times 11?"}]},
    {"id": "p-tool", "messages": [{"role": "user", "content": "Weather in Oslo?"}], "tools": [WEATHER]},
]
FIX = "; fix or remove the line, then rerun"


def answer(prompt: dict, reply: dict, **fields) -> dict:
    """An import line: the prompt's conversation (without its id), then the assistant's reply."""
    return {"messages": [*prompt["messages"], {"role": "assistant", **reply}],
            **({"tools": prompt["tools"]} if "tools" in prompt else {}), **fields}


def run_import(tmp_path, lines, *, budget=None, raw=None):
    (tmp_path / "prompts.jsonl").write_text("".join(json.dumps(p) + "\n" for p in PROMPTS))
    answers = tmp_path / "answers.jsonl"
    answers.write_text(raw if raw is not None else "".join(json.dumps(line) + "\n" for line in lines))
    summary = import_answers(
        tmp_path / "prompts.jsonl", answers, tmp_path / "responses.jsonl",
        tmp_path / "responses.summary.json",
        dataset="demo", output_token_budget=budget, target_name="smollm2",
    )
    return summary, [json.loads(line) for line in (tmp_path / "responses.jsonl").read_text().splitlines()]


def test_an_import_matched_by_id_and_content_becomes_token_rows(tmp_path, model_dir):
    tokenizer = load_tokenizer(model_dir)
    stop = stop_token_id(tokenizer)
    greet_ids = [*tokenizer.encode("Hello, Ada!", add_special_tokens=False), stop]
    # The ids the engine prefilled, as its export holds them: the chat template's rendering of the turn.
    greet_prompt_ids = render_prompt_ids(tokenizer, [{"role": "user", "content": "hi"}])
    math_prompt_tokens = len(render_prompt_ids(tokenizer, PROMPTS[1]["messages"]))
    math_completion = len(tokenizer.encode("132.", add_special_tokens=False)) + 1
    # The user turn as OpenAI text parts: the prompt set holds it joined, and it still matches.
    parts = [{"type": "text", "text": "What is 12 times 11?"}]
    math = answer({"messages": [PROMPTS[1]["messages"][0], {"role": "user", "content": parts}]},
                  {"content": "132."},
                  usage={"prompt_tokens": math_prompt_tokens, "completion_tokens": math_completion})
    call = {"id": "call_1", "type": "function",
            "function": {"name": "weather", "arguments": {"city": "Oslo"}}}
    lines = [
        answer(PROMPTS[2], {"content": None, "tool_calls": [call]}, finish_reason="tool_calls"),
        math,
        {"id": "p-greet", "messages": [{"role": "user", "content": "hi"}, {"role": "assistant",
                                                                          "content": "Hello, Ada!"}],
         "token_ids": greet_ids, "prompt_token_ids": greet_prompt_ids, "model": "our-engine"},
    ]
    summary, records = run_import(tmp_path, lines)

    assert [r["prompt_id"] for r in records] == ["p-greet", "p-math", "p-tool"]  # prompt-set order
    greet, math_record, tool = records
    fingerprint = hashlib.sha256((tmp_path / "answers.jsonl").read_bytes()).hexdigest()
    assert greet == {
        "source": "import", "prompt_id": "p-greet", "fingerprint": fingerprint,
        "request": {"model": "our-engine"},
        "response": {"content": "Hello, Ada!", "reasoning": None, "tool_calls": [], "finish_reason": "stop",
                     "token_ids": greet_ids, "prompt_token_ids": greet_prompt_ids},
        "provider": "import", "generation_id": None,
        "usage": {"prompt_tokens": None, "completion_tokens": len(greet_ids), "reasoning_tokens": None,
                  "cost": None},
        "latency_s": None, "attempts": 0,
    }
    assert math_record["request"] == {"model": "smollm2"}
    assert math_record["usage"]["completion_tokens"] == math_completion
    assert tool["response"]["tool_calls"] == [
        {"id": "call_1", "type": "function", "function": {"name": "weather", "arguments": '{"city": "Oslo"}'}}
    ]
    assert tool["response"]["finish_reason"] == "tool_calls"
    assert tool["usage"]["completion_tokens"] is None
    assert summary | {"file": None, "notes": None} == {
        "source": "import", "file": None, "fingerprint": fingerprint, "requested": 3, "done": 3,
        "truncated": 0, "completion_tokens": len(greet_ids) + math_completion, "uncounted": 1,
        "dollars": 0.0, "ended_because": "all_done", "message": "", "unmatched": 0, "duplicates": 0,
        "missing": {"count": 0, "first_ids": []}, "over_budget": 0, "notes": None,
    }
    assert json.loads((tmp_path / "responses.summary.json").read_text()) == summary

    stats = build_tokens(tmp_path / "prompts.jsonl", tmp_path / "responses.jsonl", model_dir,
                         tmp_path / "tokens.safetensors", tmp_path / "tokens.json", token_settings())
    assert stats["prompt_ids"] == ["p-greet", "p-math", "p-tool"]
    assert stats["billed"]["samples_without_billed_count"] == 1
    tensors = load_file(str(tmp_path / "tokens.safetensors"))
    expected = [Method.SERVER_IDS, Method.REBUILT_COUNT_MATCHED, Method.REBUILT_AMBIGUOUS]  # last: no count
    assert tensors["method"].tolist() == expected
    offsets, prompt_len = tensors["offsets"].tolist(), tensors["prompt_len"].tolist()
    assert tensors["input_ids"][offsets[0] + prompt_len[0]:offsets[1]].tolist() == greet_ids


def test_reasoning_is_read_from_either_key(tmp_path):
    _, records = run_import(tmp_path, [
        answer(PROMPTS[0], {"content": "Hello!", "reasoning_content": "Greet her."}),
        answer(PROMPTS[1], {"content": None, "reasoning": "Still thinking"}, finish_reason="length"),
    ])
    assert [r["response"]["reasoning"] for r in records] == ["Greet her.", "Still thinking"]
    assert [r["response"]["content"] for r in records] == ["Hello!", ""]
    assert records[1]["response"]["finish_reason"] == "length"


def test_the_budget_cuts_in_prompt_order_and_uncounted_answers_pass(tmp_path):
    lines = [
        answer(PROMPTS[2], {"content": "Sunny."}, usage={"completion_tokens": 5}),
        answer(PROMPTS[1], {"content": "132."}, usage={"completion_tokens": 7}),
        answer(PROMPTS[0], {"content": "Hello!"}),
    ]
    summary, records = run_import(tmp_path, lines, budget=10)
    assert [r["prompt_id"] for r in records] == ["p-greet", "p-math"]
    assert (summary["done"], summary["completion_tokens"], summary["uncounted"]) == (2, 7, 1)
    assert (summary["ended_because"], summary["over_budget"]) == ("token_budget", 1)
    run = load_run(["demo"], responses=[tmp_path / "responses.jsonl"],
                   summaries=[tmp_path / "responses.summary.json"])
    assert [answer.completion_tokens for answer in run.sets[0].answers or []] == [None, 7]  # not drawn as 0
    # The answer without a count is named, not added as 0.
    assert run_table(run).splitlines()[2].split()[:6] == ["demo", "2", "7", "(+1", "uncounted)", "$0.0000"]
    summary, records = run_import(tmp_path, lines, budget=12)
    assert (summary["done"], summary["completion_tokens"], summary["ended_because"]) == (3, 12, "all_done")


def test_unmatched_duplicate_and_missing_are_counted_not_refused(tmp_path, caplog):
    lines = [
        {"id": "p-greet", "messages": [{"role": "user", "content": "?"},
                                       {"role": "assistant", "content": "A"}]},
        answer(PROMPTS[0], {"content": "B"}),  # the same prompt by content: the first line wins
        answer({"messages": [{"role": "user", "content": "Not in this set."}]}, {"content": "C"}),
        {"id": "elsewhere", "messages": [{"role": "assistant", "content": "D"}]},
    ]
    with caplog.at_level(logging.WARNING):
        summary, records = run_import(tmp_path, lines)
    assert [(r["prompt_id"], r["response"]["content"]) for r in records] == [("p-greet", "A")]
    assert (summary["unmatched"], summary["duplicates"]) == (2, 1)
    assert summary["missing"] == {"count": 2, "first_ids": ["p-math", "p-tool"]}
    assert summary["ended_because"] == "import_incomplete"
    assert "has no answer for 2 of 3 prompts (first: p-math, p-tool)" in caplog.text
    assert "2 lines of" in caplog.text and "(first lines: 3, 4)" in caplog.text


GOOD = json.dumps(answer(PROMPTS[0], {"content": "Hello!"}))


def bad(reply: dict, **fields) -> str:
    return json.dumps(answer(PROMPTS[1], reply, **fields))


@pytest.mark.parametrize(("line", "says"), [
    ("{not json", "not a JSON object"),
    ("[1, 2]", "a JSON list, not an object"),
    (json.dumps({"id": "p-math"}), "no `messages` list"),
    (json.dumps({"messages": PROMPTS[1]["messages"]}), "the last message is 'user', not the assistant's"),
    (bad({"content": ""}), "the last message has no content, reasoning or tool_calls"),
    (bad({"content": "x"}, token_ids="1 2"), "`token_ids` must be a list of token ids"),
    (bad({"content": "x"}, token_ids=[1, -2]), "`token_ids` must be a list of token ids"),
    (bad({"content": "x"}, token_ids=[1, True]), "`token_ids` must be a list of token ids"),
    (bad({"content": "x"}, prompt_token_ids=[1.5]), "`prompt_token_ids` must be a list of token ids"),
    (bad({"content": "x"}, usage={"completion_tokens": "9"}), "`usage.completion_tokens` must be"),
    (bad({"tool_calls": [{"name": "weather"}]}), "a tool call without"),
    (bad({"content": ["x"]}), "the answer's `content` must be a string or null"),
    (bad({"content": "x"}, finish_reason=1), "`finish_reason` must be a string"),
])
def test_a_bad_line_stops_with_its_file_line_and_writes_nothing(tmp_path, line, says):
    with pytest.raises(AnswerImportError) as raised:
        run_import(tmp_path, [], raw=f"{GOOD}\n\n{line}\n")
    message = str(raised.value)
    assert message.startswith(f"{tmp_path / 'answers.jsonl'}:3: ")
    assert says in message and message.endswith(FIX) and "\n" not in message
    assert not (tmp_path / "responses.jsonl").exists() and not (tmp_path / "responses.summary.json").exists()


def test_a_file_that_answers_no_prompt_of_the_set_stops(tmp_path):
    stranger = answer({"messages": [{"role": "user", "content": "Not in this set."}]}, {"content": "C"})
    with pytest.raises(AnswerImportError, match=r"answers.jsonl: no line answers a prompt of set demo \(1 "):
        run_import(tmp_path, [stranger])
    assert not (tmp_path / "responses.jsonl").exists()
