"""The prompt-set stage on real files and real (local) datasets."""

from __future__ import annotations

import hashlib
import json
import os
import unicodedata
from pathlib import Path

import pytest

from eaglepipe.prompts import (
    PromptError,
    SourcedRecord,
    build_from_source,
    build_prompt_set,
    check_edited_source,
    load_hf,
    load_jsonl,
    prompt_id,
    validate_record,
)
from eaglepipe.target.chat import render_prompt_ids
from eaglepipe.target.load import load_tokenizer

DEMO = Path(__file__).resolve().parent.parent / "resources" / "sources" / "demo"


def user(text: str) -> dict:
    return {"role": "user", "content": text}


def write_jsonl(path: Path, lines: list) -> Path:
    path.write_text("\n".join(line if isinstance(line, str) else json.dumps(line) for line in lines) + "\n")
    return path


def sourced(text: str, where: str, **extra: object) -> SourcedRecord:
    return SourcedRecord({**extra, "messages": [user(text)]}, where)


def test_prompt_id_golden_vectors() -> None:
    messages = [{"role": "user", "content": "Café au lait?"}]
    canonical = '{"messages":[{"content":"Café au lait?","role":"user"}],"tools":null}'
    expected = "5f84fc012f4b58f287b68ba770815e46597017c4d93face408c7a8248f8bf8ef"
    assert hashlib.sha256(canonical.encode()).hexdigest() == expected
    assert prompt_id(messages, None) == expected

    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather in Zürich?"}]
    assert prompt_id(messages, tools) == "4a99a12fb3db78e7b33a1aa38e3c6c5d98b9b2a9aa84f814bcef059504a9ed92"


def test_prompt_id_ignores_unicode_normal_form_and_key_order() -> None:
    composed, decomposed = "caf\u00e9", "cafe\u0301"
    assert composed != decomposed and unicodedata.normalize("NFC", decomposed) == composed
    assert prompt_id([user(composed)], None) == prompt_id([user(decomposed)], None)
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "required": []}}}
    reordered = {
        "function": {"parameters": {"required": [], "type": "object"}, "name": "f"},
        "type": "function",
    }
    assert prompt_id([{"content": "hi", "role": "user"}], [reordered]) == prompt_id([user("hi")], [tool])
    assert prompt_id([user("hi")], None) != prompt_id([user("hi")], [tool])


@pytest.mark.parametrize(
    ("bad_line", "says"),
    [
        ({"messages": [user("hi"), {"role": "assistant", "content": "hello"}]}, "ends on an assistant turn"),
        (
            {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
            "'image_url' part",
        ),
        ({"messages": [{"role": "bot", "content": "hi"}]}, "role 'bot'"),
        ({"messages": []}, "non-empty list"),
        ('{"messages": [', "not valid JSON"),
        ({"messages": [user("hi")], "id": ""}, "`id` must be a non-empty string"),
        ({"messages": [{"role": "user", "content": None}]}, "`content` is missing or null"),
    ],
)
def test_validation_errors_name_the_line(tmp_path: Path, bad_line: object, says: str) -> None:
    path = write_jsonl(tmp_path / "set.jsonl", [{"messages": [user("fine")]}, "", bad_line])
    with pytest.raises(PromptError) as caught:
        load_jsonl(path, strip_trailing_assistant=False)
    message = str(caught.value)
    assert message.startswith(f"{path}:3")
    assert says in message
    assert "\n" not in message


def test_text_parts_are_joined_and_unknown_keys_dropped() -> None:
    obj = {
        "id": "p1",
        "extra": 1,
        "messages": [
            {
                "role": "user",
                "name": None,
                "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
            }
        ],
    }
    assert validate_record(obj, where="x:1", strip_trailing_assistant=False) == {
        "id": "p1",
        "messages": [{"role": "user", "content": "a\nb"}],
    }


def test_tool_turns_keep_their_call_fields() -> None:
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    messages = [
        user("go"),
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "name": "f", "content": "42"},
    ]
    record = validate_record({"messages": messages, "tools": []}, where="x:1", strip_trailing_assistant=False)
    assert record == {"messages": messages}


def test_strip_trailing_assistant(tmp_path: Path) -> None:
    chat = [
        user("q1"),
        {"role": "assistant", "content": "a1"},
        user("q2"),
        {"role": "assistant", "content": "a2"},
    ]
    path = write_jsonl(tmp_path / "set.jsonl", [{"messages": chat}, {"messages": [user("plain")]}])
    loaded = load_jsonl(path, strip_trailing_assistant=True)
    assert loaded[0].record["messages"] == chat[:3]
    stats = build_prompt_set(loaded, seed=0)[1]
    assert stats["stripped_trailing_assistant"] == 1 and stats["kept"] == 2

    only_assistant = write_jsonl(
        tmp_path / "bad.jsonl", [{"messages": [{"role": "assistant", "content": "a"}]}]
    )
    with pytest.raises(PromptError, match=rf"^{only_assistant}:1: only assistant turns"):
        load_jsonl(only_assistant, strip_trailing_assistant=True)


def test_explicit_id_collision_names_both_lines(tmp_path: Path) -> None:
    path = write_jsonl(
        tmp_path / "set.jsonl",
        [
            {"id": "same", "messages": [user("one")]},
            {"messages": [user("x")]},
            {"id": "same", "messages": [user("two")]},
        ],
    )
    with pytest.raises(PromptError) as caught:
        build_prompt_set(load_jsonl(path, strip_trailing_assistant=False), seed=0)
    assert f"{path}:1" in str(caught.value) and f"{path}:3" in str(caught.value)


def test_duplicates_are_dropped_and_counted() -> None:
    records, stats = build_prompt_set(
        [sourced("a", "f:1"), sourced("b", "f:2"), sourced("a", "f:3"), sourced("a", "f:4", id="named-a")],
        seed=0,
    )
    assert {r["id"]: r["messages"][0]["content"] for r in records} == {
        prompt_id([user("a")], None): "a",  # the first occurrence wins, so "named-a" is dropped too
        prompt_id([user("b")], None): "b",
    }
    assert stats == {
        "read": 4,
        "kept": 2,
        "duplicates_dropped": 2,
        "stripped_trailing_assistant": 0,
        "skipped_invalid": 0,
    }


def test_adding_a_prompt_keeps_the_order_of_the_others() -> None:
    base = [sourced(f"question {n}", f"f:{n}") for n in range(30)]
    before = [r["id"] for r in build_prompt_set(base, seed=7)[0]]
    after = [r["id"] for r in build_prompt_set([*base, sourced("a new one", "f:31")], seed=7)[0]]
    assert len(after) == 31
    assert [i for i in after if i in before] == before
    assert before != [r["id"] for r in build_prompt_set(base, seed=8)[0]]
    assert before != [r["id"] for r in build_prompt_set(base[::-1], seed=0)[0]][::-1]  # not input order


def test_build_from_source_writes_the_set(tmp_path: Path) -> None:
    source_path = write_jsonl(
        tmp_path / "src.jsonl", [{"id": "é-1", "messages": [user("naïve?")]}, {"messages": [user("b")]}]
    )
    out = tmp_path / "prompts" / "set.jsonl"
    stats = build_from_source(
        {"type": "jsonl", "path": str(source_path)}, out, seed=0, strip_trailing_assistant=False
    )
    assert stats["kept"] == 2
    assert "naïve?" in out.read_text(encoding="utf-8")
    written = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert {r["id"] for r in written} == {"é-1", prompt_id([user("b")], None)}
    assert [p.name for p in out.parent.iterdir()] == ["set.jsonl"]  # no temp file left behind

    with pytest.raises(PromptError, match="type 'csv' is not jsonl or hf"):
        build_from_source({"type": "csv"}, out, seed=0, strip_trailing_assistant=False)
    with pytest.raises(PromptError, match="no such file"):
        build_from_source(
            {"type": "jsonl", "path": str(tmp_path / "nope.jsonl")},
            out,
            seed=0,
            strip_trailing_assistant=False,
        )


@pytest.fixture
def hf_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import datasets

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf-cache")


def test_load_hf_openai_format_from_parquet(tmp_path: Path, hf_cache: None) -> None:
    import datasets

    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    rows = [
        {"messages": [user("first")]},
        {
            "messages": [
                user("go"),
                {"role": "assistant", "content": None, "tool_calls": [call]},
                {"role": "tool", "content": "ok", "tool_call_id": "c1"},
            ]
        },
        {"messages": [user("hi"), {"role": "assistant", "content": "hello"}]},
    ]
    datasets.Dataset.from_list(rows).to_parquet(tmp_path / "train.parquet")
    source = {"type": "hf", "name": "parquet", "data_files": str(tmp_path / "train.parquet")}

    loaded = load_hf(source, strip_trailing_assistant=False)
    assert loaded[1].record["messages"][1]["tool_calls"][0]["function"]["name"] == "f"
    assert loaded[2].where == "parquet[train]:2" and "ends on an assistant turn" in loaded[2].reason
    assert build_prompt_set(loaded, seed=0)[1]["skipped_invalid"] == 1

    stripped = load_hf(source, strip_trailing_assistant=True)
    assert build_prompt_set(stripped, seed=0)[1]["stripped_trailing_assistant"] == 1


def test_load_hf_sharegpt_with_sample(tmp_path: Path, hf_cache: None) -> None:
    rows = [
        {"conversations": [{"from": "human", "value": "q0"}, {"from": "gpt", "value": "a0"}]},
        {"conversations": [{"from": "narrator", "value": "??"}]},
        {"conversations": [{"from": "system", "value": "s"}, {"from": "human", "value": "q2"}]},
        {"conversations": [{"from": "human", "value": "q3"}]},
    ]
    write_jsonl(tmp_path / "data.jsonl", rows)
    source = {
        "type": "hf",
        "name": "json",
        "data_files": str(tmp_path / "data.jsonl"),
        "format": "sharegpt",
        "sample": 2,
    }
    loaded = load_hf(source, strip_trailing_assistant=True)
    assert len(loaded) == 3  # stops after two valid rows; q3 is never read
    assert loaded[0].record["messages"] == [user("q0")]
    assert "from='narrator'" in loaded[1].reason
    assert loaded[2].record["messages"] == [{"role": "system", "content": "s"}, user("q2")]


def test_load_hf_prompt_field_and_config_errors(tmp_path: Path, hf_cache: None) -> None:
    write_jsonl(tmp_path / "data.jsonl", [{"question": "Why?"}, {"question": None}])
    source = {
        "type": "hf",
        "name": "json",
        "data_files": str(tmp_path / "data.jsonl"),
        "prompt_field": "question",
    }
    records, stats = build_prompt_set(load_hf(source, strip_trailing_assistant=False), seed=0)
    assert records[0]["messages"] == [user("Why?")] and stats["skipped_invalid"] == 1

    with pytest.raises(PromptError, match=r"json\[train\]:0: no column 'messages'"):
        load_hf(
            {"type": "hf", "name": "json", "data_files": source["data_files"]}, strip_trailing_assistant=False
        )
    with pytest.raises(PromptError, match=r"cannot read split 'train' \(Unable to find"):
        load_hf({**source, "data_files": str(tmp_path / "missing.jsonl")}, strip_trailing_assistant=False)
    with pytest.raises(PromptError, match="unknown key"):
        load_hf({**source, "feild": "x"}, strip_trailing_assistant=False)


@pytest.mark.parametrize(
    ("name", "read", "duplicates"),
    [
        ("demo-chat", 25, 1),
        ("demo-code", 24, 0),
        ("demo-math", 24, 0),
        ("demo-multiturn", 24, 0),
        ("demo-tools", 24, 0),
    ],
)
def test_demo_sets_build(tmp_path: Path, name: str, read: int, duplicates: int) -> None:
    out = tmp_path / f"{name}.jsonl"
    stats = build_from_source(
        {"type": "jsonl", "path": str(DEMO / f"{name}.jsonl")}, out, seed=0, strip_trailing_assistant=False
    )
    assert stats == {
        "read": read,
        "kept": 24,
        "duplicates_dropped": duplicates,
        "stripped_trailing_assistant": 0,
        "skipped_invalid": 0,
    }
    records = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    if name == "demo-chat":
        assert "demo-chat-welcome" in {r["id"] for r in records}
    if name == "demo-multiturn":
        assert all(sum(m["role"] == "user" for m in r["messages"]) >= 2 for r in records)
    if name == "demo-tools":
        assert all(r["tools"] for r in records)
        assert sum(r["messages"][-1]["role"] == "tool" for r in records) >= 4
        assert sum(any("tool_calls" in m for m in r["messages"]) for r in records) >= 8


def test_demo_prompts_render_short_for_the_target(model_dir: Path) -> None:
    tokenizer = load_tokenizer(model_dir)
    for path in sorted(DEMO.glob("*.jsonl")):
        for item in load_jsonl(path, strip_trailing_assistant=False):
            ids = render_prompt_ids(tokenizer, item.record["messages"], item.record.get("tools"))
            assert len(ids) < 512, item.where


def test_an_edited_source_is_checked_without_writing(tmp_path: Path) -> None:
    built = write_jsonl(tmp_path / "built.jsonl", [{"id": "x", "messages": [user("hi")]}])
    source = {"type": "jsonl", "path": str(tmp_path / "source.jsonl")}
    broken = write_jsonl(tmp_path / "source.jsonl", [{"messages": [user("hi")]}, "{not json"])
    os.utime(broken, ns=(0, built.stat().st_mtime_ns - 1))
    check_edited_source(source, built, seed=0, strip_trailing_assistant=False)  # older: not read
    os.utime(broken, ns=(0, built.stat().st_mtime_ns + 1))
    with pytest.raises(PromptError, match=r"source\.jsonl:2"):
        check_edited_source(source, built, seed=0, strip_trailing_assistant=False)
    check_edited_source(source, tmp_path / "never-built.jsonl", seed=0, strip_trailing_assistant=False)
    assert built.read_text().count("\n") == 1
