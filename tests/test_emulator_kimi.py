"""Kimi mode as the client meets it: the offline Kimi corpus over real HTTP on loopback, each endpoint with
its provider's habits, read by the pipeline's own reply reader (streamed and not).

What the client records must be what `text_like.engine_reply` gives offline for the endpoint's engine
switch: the same reasoning (also when it comes only in `reasoning_details`), content and tool calls (also
when parallel calls all come at index 0), with the ids each endpoint's habit gives, and a bill of the true
ids. Every answer and chunk is checked against OpenRouter's published schemas.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from stage_settings import token_settings
from support.api_schemas import validate
from support.emulator import running_emulator
from support.emulator.__main__ import main, parse_args
from support.emulator.kimi_mode import KimiCorpus
from support.emulator.kimi_synthetic import LITERAL_SPECIALS, TrueSample, kimi_corpus

from eaglepipe.emulator.errors import EmulatorError
from eaglepipe.emulator.providers import load_endpoints
from eaglepipe.emulator.text_like import SECTION_BEGIN, SWITCHES, EngineReply, engine_reply
from eaglepipe.openrouter.replies import read_reply, read_streamed_reply
from eaglepipe.target.chat_format import chat_format_for
from eaglepipe.tokens.methods import Method
from eaglepipe.tokens.probe import usability_probe
from eaglepipe.tokens.rebuild import Rebuilder

MODEL = "moonshotai/kimi-k2.5"
COUNT, SEED = 24, 3
INSTANT = ["--latency-s", "0", "--tokens-per-s", "0"]
# tag -> habits; every tag is its own provider, so routing by `only` picks the habits.
HABITS: dict[str, dict[str, str]] = {
    "vllm": {"text_like": "vllm"},
    "vllm-ids": {"text_like": "vllm_ids"},
    "sglang-details": {
        "text_like": "sglang",
        "reasoning_field": "details_only",
        "tool_ids": "call_random",
        "tool_index": "zero",
    },
    "spaced-renumbered": {"text_like": "vllm_spaced", "tool_ids": "renumbered", "tool_index": "zero"},
    "stripping": {"text_like": "sglang_stripping", "reasoning_field": "details_only"},
    "drops-text": {"text_like": "vllm", "tool_parser": "drops_text"},
    "leaks-markers": {"text_like": "vllm", "tool_parser": "leaks_markers"},
}


def endpoints_config(habits: dict[str, dict[str, str]]) -> dict[str, Any]:
    return {
        "endpoints": [
            {"provider_name": tag, "tag": tag, "quantization": "int4", "price_per_m": [0.6, 2.5], "habits": h}
            for tag, h in habits.items()
        ]
    }


@pytest.fixture(scope="module")
def corpus(kimi) -> list[TrueSample]:
    return kimi_corpus(kimi, COUNT, SEED)


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory, kimi_dir: Path) -> Iterator[str]:
    folder = tmp_path_factory.mktemp("kimi-mode")
    (folder / "endpoints.yaml").write_text(yaml.safe_dump(endpoints_config(HABITS)))
    args = [
        *INSTANT,
        "--model-id",
        MODEL,
        "--config",
        str(folder / "endpoints.yaml"),
        "--kimi-corpus",
        str(kimi_dir),
        "--kimi-count",
        str(COUNT),
        "--kimi-seed",
        str(SEED),
        "--tokens-per-event",
        "3",
        "--store-content",
    ]
    with running_emulator(None, extra_args=args, log_path=folder / "emulator.log") as base_url:
        yield base_url


def request(sample: TrueSample, tag: str, stream: bool, **fields: Any) -> dict[str, Any]:
    body = {
        "model": MODEL,
        "messages": sample.prompt["messages"],
        "max_tokens": 8192,
        "provider": {"only": [tag]},
        "usage": {"include": True},
        "stream": stream,
        **fields,
    }
    if "tools" in sample.prompt:
        body["tools"] = sample.prompt["tools"]
    return body


def offline(kimi, sample: TrueSample, tag: str) -> EngineReply:
    return engine_reply(
        kimi,
        sample.answer_ids,
        SWITCHES[HABITS[tag]["text_like"]],
        stopped=sample.stopped,
        thinking=sample.thinking,
        tool_history=sample.tool_history,
    )


async def read_all(url: str, corpus: list[TrueSample]) -> dict[tuple[int, str, bool], dict[str, Any]]:
    """Every sample from every endpoint, streamed and not, as the client records it."""
    limit = asyncio.Semaphore(8)

    async def one(http: httpx.AsyncClient, index: int, tag: str, stream: bool) -> dict[str, Any]:
        async with limit:
            reader = read_streamed_reply if stream else read_reply
            return await reader(http, request(corpus[index], tag, stream))

    keys = [(i, tag, stream) for i in range(len(corpus)) for tag in HABITS for stream in (False, True)]
    async with httpx.AsyncClient(base_url=url + "/", timeout=30) as http:
        records = await asyncio.gather(*(one(http, *key) for key in keys))
    return dict(zip(keys, records, strict=True))


@pytest.fixture(scope="module")
def records(url: str, corpus: list[TrueSample]) -> dict[tuple[int, str, bool], dict[str, Any]]:
    return asyncio.run(read_all(url, corpus))


def test_the_corpus_holds_what_the_habits_need(kimi, corpus: list[TrueSample]) -> None:
    """Without these the other tests would prove less than they say."""
    calls = [len(offline(kimi, s, "vllm").tool_calls) for s in corpus]
    assert sum(n >= 2 for n in calls) >= 2  # parallel calls
    assert any(n and offline(kimi, s, "vllm").content.strip() for n, s in zip(calls, corpus, strict=True))
    assert any(s.thinking for s in corpus) and any(not s.stopped for s in corpus)


@pytest.mark.parametrize("tag", sorted(HABITS))
def test_the_client_records_what_the_engine_switch_returns(kimi, corpus, records, tag: str) -> None:
    habits = HABITS[tag]
    for index, sample in enumerate(corpus):
        expected = offline(kimi, sample, tag)
        for stream in (False, True):
            where = (sample.prompt["id"], tag, stream)
            record = records[index, tag, stream]
            response = record["response"]
            assert record["provider"] == tag
            assert record["usage"]["completion_tokens"] == len(sample.ids), where  # the true ids, billed
            think_end = kimi.special_id("</think>")
            reasoning = (
                sample.answer_ids.index(think_end)
                if think_end in sample.answer_ids
                else len(sample.answer_ids)
            )
            assert record["usage"]["reasoning_tokens"] == (reasoning if sample.thinking else 0), where
            assert response["reasoning"] == expected.reasoning, where
            if habits.get("reasoning_field") == "details_only" and expected.reasoning:
                assert response["reasoning_details"] == [
                    {"type": "reasoning.text", "text": expected.reasoning, "format": "unknown", "index": 0}
                ], where
            calls = response["tool_calls"]
            assert [c["function"] for c in calls] == [c["function"] for c in expected.tool_calls], where
            ids = [c["id"] for c in calls]
            if habits.get("tool_ids") == "call_random":
                assert all(i.startswith("call_") for i in ids) and len(set(ids)) == len(ids), where
            elif habits.get("tool_ids") == "renumbered":
                assert ids == [f"functions.{c['function']['name']}:{n}" for n, c in enumerate(calls)], where
            else:
                assert ids == [c["id"] for c in expected.tool_calls], where
            parser = habits.get("tool_parser")
            if parser == "drops_text" and calls:
                assert response["content"] == "", where
            elif parser == "leaks_markers" and calls:
                assert response["content"].startswith(expected.content), where
                assert SECTION_BEGIN in response["content"], where
            else:
                assert response["content"] == expected.content, where
            finish = "length" if not sample.stopped else "tool_calls" if calls else "stop"
            assert response["finish_reason"] == finish, where


def test_generation_and_its_stored_content_agree_with_the_answer(url, corpus, records) -> None:
    """`/generation` and `/generation/content` (`--store-content`) describe each answer as the client got
    it: finish reason (tool calls included), reasoning tokens, and the content and reasoning text."""
    for (index, tag, stream), record in records.items():
        if index % 4:  # a quarter of the samples, every endpoint, both modes
            continue
        where = (corpus[index].prompt["id"], tag, stream)
        query = {"id": record["generation_id"]}
        generation = httpx.get(f"{url}/generation", params=query).json()["data"]
        stored = httpx.get(f"{url}/generation/content", params=query).json()["data"]["output"]
        assert generation["finish_reason"] == record["response"]["finish_reason"], where
        assert generation["native_tokens_reasoning"] == record["usage"]["reasoning_tokens"], where
        assert stored["completion"] == record["response"]["content"], where
        assert stored["reasoning"] == record["response"]["reasoning"], where


def test_reasoning_in_details_only_is_read_streamed_and_not(records, corpus) -> None:
    thinking = [i for i, s in enumerate(corpus) if s.thinking]
    for stream in (False, True):
        for index in thinking:
            both, details = records[index, "vllm", stream], records[index, "stripping", stream]
            assert "reasoning_details" in details["response"], (index, stream)
            assert details["response"]["reasoning"], (index, stream)
            assert both["response"]["reasoning"], (index, stream)


def test_parallel_calls_at_index_zero_stay_apart(kimi, corpus, records) -> None:
    parallel = [i for i, s in enumerate(corpus) if len(offline(kimi, s, "sglang-details").tool_calls) >= 2]
    assert parallel
    for index in parallel:
        whole = records[index, "sglang-details", False]["response"]["tool_calls"]
        streamed = records[index, "sglang-details", True]["response"]["tool_calls"]
        assert [c["function"] for c in streamed] == [c["function"] for c in whole]
        assert len({c["id"] for c in streamed}) == len(streamed) >= 2


def raw_answers(url: str, body: dict[str, Any]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The whole answer and the stream's chunks as sent, each checked against the published schemas."""
    with httpx.Client(base_url=url, timeout=30) as http:
        whole = http.post("/chat/completions", json={**body, "stream": False}).json()
        validate("chat_result", whole)
        with http.stream("POST", "/chat/completions", json={**body, "stream": True}) as response:
            lines = [line for line in response.iter_lines() if line.startswith("data: {")]
    chunks = [json.loads(line.removeprefix("data: ")) for line in lines]
    for chunk in chunks:
        validate("chat_chunk", chunk)
    return whole, chunks


@pytest.mark.parametrize("tag", sorted(HABITS))
def test_answers_and_chunks_are_what_openrouter_documents_and_show_the_habit(
    kimi, corpus, url: str, tag: str
) -> None:
    index = max(range(len(corpus)), key=lambda i: len(offline(kimi, corpus[i], tag).tool_calls))
    sample, habits = corpus[index], HABITS[tag]
    whole, chunks = raw_answers(url, request(sample, tag, False, return_token_ids=True))
    deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
    fragments = [call for d in deltas for call in d.get("tool_calls", [])]
    message = whole["choices"][0]["message"]
    assert whole["choices"][0]["finish_reason"] == "tool_calls" and len(message["tool_calls"]) >= 2
    assert whole["usage"]["completion_tokens"] == len(sample.ids)
    assert chunks[-1]["usage"]["completion_tokens"] == len(sample.ids)
    if habits.get("reasoning_field") == "details_only":
        assert message["reasoning"] is None and message["reasoning_details"][0]["text"]
        assert not any(d.get("reasoning") for d in deltas) and any(d.get("reasoning_details") for d in deltas)
    else:
        assert message["reasoning"] and any(d.get("reasoning") for d in deltas)
    indexes = [f["index"] for f in fragments]
    headers = [f for f in fragments if "id" in f]
    assert [h["function"]["name"] for h in headers] == [c["function"]["name"] for c in message["tool_calls"]]
    if habits.get("tool_index") == "zero":
        assert set(indexes) == {0}
    else:
        assert [h["index"] for h in headers] == list(range(len(headers)))
    assert len(fragments) > len(headers)  # arguments come in pieces after the id and name
    returns_ids = SWITCHES[habits["text_like"]].returns_token_ids
    token_ids = [i for c in chunks if c["choices"] for i in c["choices"][0].get("token_ids", [])]
    assert whole["choices"][0].get("token_ids") == (sample.answer_ids if returns_ids else None)
    assert token_ids == (sample.answer_ids if returns_ids else [])


def test_a_conversation_outside_the_corpus_is_refused(url: str, corpus) -> None:
    body = request(corpus[0], "vllm", False)
    body["messages"] = [*body["messages"][:-1], {"role": "user", "content": "Something else entirely."}]
    with httpx.Client(base_url=url, timeout=30) as http:
        refused = http.post("/chat/completions", json=body)
    assert refused.status_code == 400
    assert "not in the emulator's Kimi corpus" in refused.json()["error"]["message"]


def test_the_probe_sees_leaked_markers_and_the_bill_sees_dropped_text(
    kimi, kimi_dir, corpus, records
) -> None:
    """The usability probe (the token stage's structural check) flags a parser that leaks its tool section
    into the content. It cannot see content a parser dropped, since what is left is well formed (only
    marker text the model wrote, which the shorter text no longer pays for, gives it away); the bill can:
    the rebuilt answer is shorter than the ids billed, so the token stage drops it as off by k."""
    probe = usability_probe(kimi_dir)
    rebuilder = Rebuilder(chat_format_for(kimi), token_settings())
    with_text_before_calls = [
        i
        for i, s in enumerate(corpus)
        if (reply := offline(kimi, s, "vllm")).tool_calls and reply.content.strip() and s.stopped
    ]
    assert with_text_before_calls
    for index in with_text_before_calls:
        sample = corpus[index]
        for stream in (False, True):
            leaked, dropped, sound = (
                {**records[index, tag, stream], "prompt_id": sample.prompt["id"], "request": {"model": MODEL}}
                for tag in ("leaks-markers", "drops-text", "vllm")
            )
            assert (probe(sample.prompt, leaked) or "").startswith("marker_text_in_reply"), index
            seen = probe(sample.prompt, dropped)
            assert seen is None or seen.startswith("marker_text_in_reply"), index
            assert probe(sample.prompt, sound) is None, index
            rebuilt = rebuilder.rebuild({sample.prompt["id"]: sample.prompt}, [dropped], "drops-text")
            assert rebuilt.samples[0].method is Method.REBUILT_OFF_BY_K, index
            assert rebuilt.samples[0].billed_diff < 0, index


def test_the_probe_lets_a_model_write_marker_text_when_the_bill_agrees(
    kimi, kimi_dir, corpus, records
) -> None:
    """The corpus's model writes `<|im_end|>`, `[EOS]` and the like as text in some answers. From a sound
    provider the text's rebuild has the billed length, so the probe holds nothing against it."""
    probe = usability_probe(kimi_dir)
    writing = [
        i
        for i, s in enumerate(corpus)
        if any(m in kimi.decode(s.answer_ids) for m in LITERAL_SPECIALS) and s.stopped
    ]
    assert writing
    for index in writing:
        sample = corpus[index]
        for stream in (False, True):
            sound = {
                **records[index, "vllm", stream],
                "prompt_id": sample.prompt["id"],
                "request": {"model": MODEL},
            }
            assert probe(sample.prompt, sound) is None, index


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--model-dir", "m", "--kimi-corpus", "k"], "--kimi-corpus applies only with --synthetic"),
        (["--synthetic", "--kimi-corpus", "k", "--kimi-count", "0"], "--kimi-count must be at least 1"),
    ],
)
def test_the_command_line_takes_kimi_mode_only_with_synthetic(argv: list[str], message: str, capsys) -> None:
    with pytest.raises(SystemExit) as exit_info:
        parse_args(argv)
    assert exit_info.value.code == 2 and message in capsys.readouterr().err


@pytest.mark.parametrize(
    ("habits", "message"),
    [
        ({"tool_index": "one"}, "habits.tool_index 'one' is not one of proper, zero"),
        ({"text_like": "tgi"}, "habits.text_like 'tgi' is not one of vllm, exact"),
        ({"accent": "x"}, "unknown habit 'accent'"),
        ("vllm", "'habits' must be an object"),
    ],
)
def test_an_endpoint_table_with_a_bad_habit_is_named(tmp_path: Path, habits: Any, message: str) -> None:
    (tmp_path / "endpoints.yaml").write_text(yaml.safe_dump(endpoints_config({"p": habits})))
    with pytest.raises(EmulatorError) as caught:
        load_endpoints(tmp_path / "endpoints.yaml", MODEL, 1000)
    assert str(caught.value).startswith(f"{tmp_path / 'endpoints.yaml'}: endpoints[0]: ")
    assert message in str(caught.value)


def test_habits_outside_kimi_mode_are_refused(tmp_path: Path, capsys) -> None:
    """Synthetic words have no reasoning or tool calls to shape: a table with habits is a mistake."""
    (tmp_path / "endpoints.yaml").write_text(yaml.safe_dump(endpoints_config({"p": {"tool_index": "zero"}})))
    assert main(["--synthetic", "--config", str(tmp_path / "endpoints.yaml")]) == 2
    assert "endpoint p sets `habits`, which only a Kimi-layout target applies" in capsys.readouterr().err


def test_a_tokenizer_directory_without_kimi_layout_is_named(tmp_path: Path) -> None:
    with pytest.raises(EmulatorError, match="not a Kimi-layout tokenizer directory"):
        KimiCorpus.build(tmp_path, 2, 0)
