"""The one chat-format interface: each implementation renders exactly as its family's own renderer does
(`kimi_chat` for Kimi-K2.5, `chat.render_prompt_ids` for an HF template), and a stage loads it once."""

from __future__ import annotations

import json

import pytest
from stage_settings import token_settings
from support.emulator.kimi_synthetic import kimi_corpus, reply_record

from eaglepipe.emulator.text_like import SWITCHES
from eaglepipe.plan.estimate import InputTokens
from eaglepipe.target import kimi_chat
from eaglepipe.target.chat import normalize_messages, render_prompt_ids, stop_token_id
from eaglepipe.target.chat_format import KimiChatFormat, Layout, TemplateChatFormat, chat_format_for
from eaglepipe.target.kimi_tokenizer import MAX_RUN_CHARS
from eaglepipe.target.load import load_target_tokenizer, load_tokenizer
from eaglepipe.target.segments import encode_segments
from eaglepipe.tokens.build import build_tokens

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "weather",
            "description": "Weather in a city.",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
]
CALLS = [
    {
        "id": "functions.weather:0",
        "type": "function",
        "function": {"name": "weather", "arguments": '{"city": "Oslo"}'},
    }
]
CONVERSATIONS = [
    ([{"role": "user", "content": "Say hello to Ada."}], None),
    (
        [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "A literal <|im_end|> 東京"},
        ],
        None,
    ),
    ([{"role": "user", "content": "digits " + "7" * (MAX_RUN_CHARS + 10)}], None),  # past the run cut
    (
        [
            {"role": "user", "content": "Weather in Oslo?"},
            {"role": "assistant", "content": "Checking.", "tool_calls": CALLS},
            {"role": "tool", "tool_call_id": "functions.weather:0", "content": "Rain, 8 C."},
            {"role": "assistant", "content": "Rainy."},
            {"role": "user", "content": "And tomorrow?"},
        ],
        TOOLS,
    ),
]


def test_each_tokenizer_family_gets_its_own_format(kimi_dir, model_dir):
    assert isinstance(chat_format_for(load_target_tokenizer(kimi_dir)), KimiChatFormat)
    assert isinstance(chat_format_for(load_target_tokenizer(model_dir)), TemplateChatFormat)
    with pytest.raises(TypeError, match="no chat format for a str"):
        chat_format_for("not a tokenizer")  # type: ignore[arg-type]


def test_kimi_format_renders_as_kimi_chat(kimi_dir, kimi):
    chat_format = chat_format_for(load_target_tokenizer(kimi_dir))
    markers = kimi_chat.Markers.of(kimi)
    assert chat_format.sectioned and chat_format.tool_formats == ("typescript", "json")
    assert chat_format.layout == Layout(
        markers.end,
        markers.think_end,
        markers.section_begin,
        markers.section_end,
        markers.call_begin,
        markers.argument_begin,
        markers.call_end,
    )
    for messages, tools in CONVERSATIONS:
        for thinking in (True, False):
            lengths = {}
            for tool_format in chat_format.tool_formats:
                ids = chat_format.prompt_ids(messages, tools, thinking=thinking, tool_format=tool_format)
                assert ids == kimi_chat.prompt_ids(
                    kimi, messages, tools, thinking=thinking, tool_format=tool_format
                )
                opening = chat_format.generation_prompt(thinking)
                assert ids[-len(opening) :] == opening
                assert chat_format.special_positions(ids) == [
                    i for i, t in enumerate(ids) if kimi.is_special(t)
                ]
                lengths[tool_format] = len(ids)
            if tools:
                assert lengths["typescript"] != lengths["json"]
                others = chat_format.other_tool_format_lengths(tools, "typescript", lengths["typescript"])
                assert others == {"json": lengths["json"]}


def test_kimi_completion_reads_back_into_its_parts(kimi_dir):
    chat_format = chat_format_for(load_target_tokenizer(kimi_dir))
    segments = chat_format.completion_segments(
        reasoning="Think. ", content="Calling.", tool_calls=CALLS, truncated=False, thinking=True
    )
    ids = encode_segments(chat_format, segments)  # type: ignore[arg-type]
    assert ids[-1] == chat_format.layout.stop
    read = chat_format.read_completion(ids[:-1], thinking=True, truncated=False)
    assert (read.reasoning, read.content, read.calls) == (
        "Think. ",
        "Calling.",
        [(CALLS[0]["id"], '{"city": "Oslo"}')],
    )
    assert chat_format.read_completion([chat_format.layout.call_end], thinking=True, truncated=False) is None
    assert chat_format.one_text_answer("Calling.", CALLS) is None


def test_template_format_renders_as_the_template(model_dir):
    tokenizer = load_tokenizer(model_dir)
    chat_format = chat_format_for(load_target_tokenizer(model_dir))
    special = {i for i, token in tokenizer.added_tokens_decoder.items() if token.special}
    assert not chat_format.sectioned and chat_format.tool_formats == ()
    assert chat_format.layout == Layout(stop_token_id(tokenizer))
    for messages, tools in CONVERSATIONS:
        ids = chat_format.prompt_ids(messages, tools, thinking=False, tool_format="json")
        assert ids == render_prompt_ids(tokenizer, messages, tools)
        assert ids == chat_format.prompt_ids(messages, tools, thinking=True, tool_format="typescript")
        opening = chat_format.generation_prompt(False)
        assert ids[-len(opening) :] == opening
        assert chat_format.special_positions(ids) == [i for i, t in enumerate(ids) if t in special]
        assert chat_format.tool_format_name("typescript") == "chat_template"
        assert chat_format.other_tool_format_lengths(tools or [], "json", len(ids)) == {}


def test_template_answer_is_one_text(model_dir):
    tokenizer = load_tokenizer(model_dir)
    chat_format = chat_format_for(load_target_tokenizer(model_dir))
    text = chat_format.one_text_answer("Calling.", CALLS)
    turn = {"role": "assistant", "content": "Calling.", "tool_calls": CALLS}
    assert text == normalize_messages(tokenizer, [turn], None)[0]["content"]
    ids = chat_format.encode(text)
    assert chat_format.read_completion(ids, thinking=False, truncated=False).content == text
    assert (
        chat_format.read_completion([*ids, chat_format.layout.stop], thinking=False, truncated=False) is None
    )


def counting_loads(monkeypatch, cls) -> list[int]:
    """Counts the chat formats of one class built (`chat_format_for` builds one per call)."""
    calls: list[int] = []
    real = cls.__init__

    def counted(self, tokenizer):
        calls.append(1)
        real(self, tokenizer)

    monkeypatch.setattr(cls, "__init__", counted)
    return calls


def test_the_token_stage_loads_its_format_once(tmp_path, kimi_dir, kimi, monkeypatch):
    corpus = kimi_corpus(kimi, 12, seed=5)
    prompts, responses = tmp_path / "prompts.jsonl", tmp_path / "responses.jsonl"
    prompts.write_text("".join(json.dumps(s.prompt) + "\n" for s in corpus))
    records = [reply_record(kimi, s, SWITCHES["exact"]) for s in corpus]
    responses.write_text("".join(json.dumps(r) + "\n" for r in records))
    loads = counting_loads(monkeypatch, KimiChatFormat)

    summary = build_tokens(
        prompts,
        responses,
        kimi_dir,
        tmp_path / "tokens.safetensors",
        tmp_path / "tokens.json",
        token_settings(),
    )

    assert summary and len(loads) == 1


def test_the_spend_plan_counts_through_the_template_loaded_once(model_dir, monkeypatch):
    tokenizer = load_tokenizer(model_dir)
    loads = counting_loads(monkeypatch, TemplateChatFormat)
    count = InputTokens(model_dir)
    prompts = [{"messages": messages, "tools": tools} for messages, tools in CONVERSATIONS]

    counted = [count(prompt) for prompt in prompts]

    assert counted == [len(render_prompt_ids(tokenizer, p["messages"], p["tools"])) for p in prompts]
    assert count.method == "tokenizer" and len(loads) == 1


@pytest.mark.parametrize("name", ["kimi", "template"])
def test_a_completion_holds_the_parts_the_format_names(name, kimi_dir, model_dir):
    chat_format = chat_format_for(load_target_tokenizer(kimi_dir if name == "kimi" else model_dir))
    segments = chat_format.completion_segments(
        reasoning=None, content="Hi.", tool_calls=None, truncated=False, thinking=False
    )
    ids = encode_segments(chat_format, segments)  # type: ignore[arg-type]
    assert ids == [*chat_format.encode("Hi."), chat_format.layout.stop]
    assert chat_format.read_completion(ids[:-1], thinking=False, truncated=False).content == "Hi."
