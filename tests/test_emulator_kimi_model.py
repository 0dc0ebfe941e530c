"""Model mode on a Kimi-layout target (the tiny Kimi-K2.5): the model's own greedy ids over real HTTP, split
into reasoning, content and tool calls by each endpoint's provider habits, read by the pipeline's own reply
reader. A stream is parsed while the answer is being generated, so what the client assembles from it must
equal what the same endpoint returns in one piece, and both must be what `text_like.engine_reply` gives
offline for the ids the model produced."""

from __future__ import annotations

import asyncio
import functools
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from support.api_schemas import validate
from test_emulator_kimi import HABITS, endpoints_config

from eaglepipe.emulator.runner import running_emulator
from eaglepipe.emulator.text_like import SWITCHES, engine_reply
from eaglepipe.openrouter.replies import read_reply, read_streamed_reply
from eaglepipe.target.kimi_chat import tool_history
from eaglepipe.target.load import load_target_tokenizer
from eaglepipe.target.tiny import KIMI_K25_TINY

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
MODEL = "local/kimi-k25-tiny"
CONVERSATIONS = {"demo-tools": [0, 3, 7], "demo-chat": [0, 5], "demo-multiturn": [2]}


def conversations() -> list[dict[str, Any]]:
    out = []
    for ds, rows in CONVERSATIONS.items():
        lines = (REPO / f"resources/sources/demo/{ds}.jsonl").read_text().splitlines()
        out += [json.loads(lines[row]) for row in rows]
    return out


@pytest.fixture(scope="module")
def url(tiny_targets, tmp_path_factory) -> Iterator[str]:
    folder = tmp_path_factory.mktemp("kimi-model")
    (folder / "endpoints.yaml").write_text(yaml.safe_dump(endpoints_config(HABITS)))
    args = ["--model-id", MODEL, "--config", str(folder / "endpoints.yaml"), "--tokens-per-event", "2"]
    with running_emulator(
        tiny_targets[KIMI_K25_TINY], extra_args=args, log_path=folder / "emulator.log"
    ) as base:
        yield base


def request(conversation: dict[str, Any], tag: str, stream: bool, **fields: Any) -> dict[str, Any]:
    body = {
        "model": MODEL,
        "messages": conversation["messages"],
        "max_tokens": 64,
        "temperature": 0.0,
        "provider": {"only": [tag]},
        "usage": {"include": True},
        "stream": stream,
        "reasoning": {"enabled": True},
        **fields,
    }
    if conversation.get("tools"):
        body["tools"] = conversation["tools"]
    return body


@pytest.fixture(scope="module")
def records(url) -> dict[tuple[int, str, bool], dict[str, Any]]:
    async def read_all() -> dict[tuple[int, str, bool], dict[str, Any]]:
        keys = [
            (i, tag, stream)
            for i in range(len(conversations()))
            for tag in HABITS
            for stream in (False, True)
        ]
        async with httpx.AsyncClient(base_url=url + "/", timeout=120) as http:
            readers = [
                (read_streamed_reply if stream else read_reply)(
                    http, request(conversations()[i], tag, stream)
                )
                for i, tag, stream in keys
            ]
            return dict(zip(keys, await asyncio.gather(*readers), strict=True))

    return asyncio.run(read_all())


@functools.cache
def true_ids(url: str, index: int) -> tuple[list[int], list[int], str]:
    """(prompt ids, answer ids, finish reason) of the model's answer, from the endpoint that returns ids."""
    ask = request(conversations()[index], "vllm-ids", False, return_token_ids=True)
    body = httpx.post(f"{url}/chat/completions", json=ask, timeout=120).json()
    validate("chat_result", body)
    choice = body["choices"][0]
    return body["prompt_token_ids"], choice["token_ids"], choice["finish_reason"]


def test_the_answers_carry_reasoning_and_tool_calls_through_kimis_markers(url, tiny_targets, records):
    """Without these the comparison below would prove less than it says."""
    answers = [r["response"] for (i, tag, stream), r in records.items() if tag == "vllm"]
    assert all(a["reasoning"] for a in answers)
    assert any(a["tool_calls"] for a in answers) and any(
        not a["tool_calls"] and a["content"] for a in answers
    )
    tokenizer = load_target_tokenizer(tiny_targets[KIMI_K25_TINY])
    prompt, _, _ = true_ids(url, 0)
    assert prompt[-4:] == [
        tokenizer.special_id("<|im_assistant|>"),
        *tokenizer.encode("assistant"),
        tokenizer.special_id("<|im_middle|>"),
        tokenizer.special_id("<think>"),
    ]


@pytest.mark.parametrize("tag", sorted(HABITS))
def test_streamed_and_whole_answers_are_what_the_engine_switch_gives_for_the_models_ids(
    url, tiny_targets, records, tag
):
    tokenizer = load_target_tokenizer(tiny_targets[KIMI_K25_TINY])
    for index, conversation in enumerate(conversations()):
        _, ids, finish = true_ids(url, index)
        stopped = finish != "length"
        expected = engine_reply(
            tokenizer,
            ids,
            SWITCHES[HABITS[tag]["text_like"]],
            stopped=stopped,
            thinking=True,
            tool_history=tool_history(conversation["messages"]),
        )
        whole, streamed = records[index, tag, False], records[index, tag, True]
        for record in (whole, streamed):
            response, where = record["response"], (index, tag)
            assert record["usage"]["completion_tokens"] == len(ids) + int(stopped), where
            assert response["reasoning"] == expected.reasoning, where
            assert [c["function"] for c in response["tool_calls"]] == [
                c["function"] for c in expected.tool_calls
            ]
            parser = HABITS[tag].get("tool_parser")
            if parser is None:
                assert response["content"] == expected.content, where
        assert streamed["response"]["content"] == whole["response"]["content"], (index, tag)
        if HABITS[tag].get("tool_ids") != "call_random":
            assert [c["id"] for c in streamed["response"]["tool_calls"]] == [
                c["id"] for c in whole["response"]["tool_calls"]
            ]


def test_a_request_with_reasoning_off_gets_an_instant_turn(url, tiny_targets):
    tokenizer = load_target_tokenizer(tiny_targets[KIMI_K25_TINY])
    body = request(conversations()[3], "vllm-ids", False, reasoning={"enabled": False}, return_token_ids=True)
    answer = httpx.post(f"{url}/chat/completions", json=body, timeout=120).json()
    assert answer["prompt_token_ids"][-2:] == [
        tokenizer.special_id("<think>"),
        tokenizer.special_id("</think>"),
    ]
    assert answer["choices"][0]["message"]["reasoning"] is None
    assert answer["usage"]["completion_tokens_details"]["reasoning_tokens"] == 0
