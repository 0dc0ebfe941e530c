"""Kimi-K2.5's chat format rendered natively: prompts, history, tool declarations, the generated turn."""

from __future__ import annotations

import json
import os

import pytest
from support.segments import segments_text

from eaglepipe.target import chatml, kimi_chat
from eaglepipe.target.chat import normalize_messages, render_prompt_ids
from eaglepipe.target.chat_format import chat_format_for
from eaglepipe.target.kimi_chat import KimiChatError, completion_segments, prompt_ids, prompt_segments
from eaglepipe.target.kimi_layout import ensure_kimi_layout
from eaglepipe.target.kimi_tokenizer import KimiTokenizer
from eaglepipe.target.kimi_tools import ToolDeclarationError, declare_tools
from eaglepipe.target.load import load_target_tokenizer
from eaglepipe.target.segments import Special, Text, encode_segments

SYSTEM = {"role": "system", "content": "You are a helpful assistant."}
USER = {"role": "user", "content": "Who are you?"}
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather for a city.\n\nUse it for forecasts too.",
            "parameters": {
                "type": "object",
                "required": ["city"],
                "properties": {
                    "city": {"type": "string", "description": "City name", "minLength": 1},
                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"], "default": "celsius"},
                    "days": {"type": "integer", "minimum": 1, "maximum": 7, "default": 1},
                    "fields": {
                        "type": "array",
                        "items": {"type": "string", "description": "A field name"},
                        "maxItems": 5,
                    },
                    "extra": {
                        "type": "object",
                        "properties": {"lang": {"type": ["string", "null"]}},
                        "additionalProperties": False,
                    },
                },
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "search",
            "description": "Search the web.",
            "parameters": {
                "type": "object",
                "required": ["query"],
                "properties": {
                    "query": {"type": "string"},
                    "limit": {"anyOf": [{"type": "integer"}, {"type": "null"}]},
                    "tags": {"type": "array", "items": {"type": "string"}},
                },
            },
        },
    },
]
TYPESCRIPT = """\
# Tools

## functions
namespace functions {
// Current weather for a city.

// Use it for forecasts too.
type get_weather = (_: {
  // City name
  // minLength: 1
  city: string,
  // maximum: 7, minimum: 1
  // Default: 1
  days?: number,
  extra?: {
    lang?: string | null,
    [k: string]: never
  },
  // maxItems: 5
  fields?: Array<
    // A field name
    string
  >,
  // Default: "celsius"
  unit?: "celsius" | "fahrenheit"
}) => any;
// Search the web.
type search = (_: {
  query: string,
  limit?: number | null,
  tags?: Array<string>
}) => any;
}
"""
CALLS = [
    {
        "id": "functions.get_weather:0",
        "type": "function",
        "function": {"name": "get_weather", "arguments": {"city": "Oslo", "days": 3}},
    },
    {
        "id": "functions.search:1",
        "type": "function",
        "function": {"name": "search", "arguments": '{"query":"Oslo  snow"}'},
    },
]


@pytest.fixture(scope="module")
def kimi(tmp_path_factory) -> KimiTokenizer:
    layout = ensure_kimi_layout(tmp_path_factory.getbasetemp() / "kimi-layout")
    tokenizer = load_target_tokenizer(layout.directory)
    assert isinstance(tokenizer, KimiTokenizer)
    return tokenizer


def special(kimi, name: str) -> Special:
    return Special(kimi.special_id(name))


def turn(kimi, marker: str, role: str) -> list:
    return [special(kimi, marker), Text(role, "role"), special(kimi, "<|im_middle|>")]


def test_system_user_and_the_two_generation_prompts(kimi):
    thinking = prompt_segments(kimi, [SYSTEM, USER])
    end = special(kimi, "<|im_end|>")
    head = [
        *turn(kimi, "<|im_system|>", "system"),
        Text(SYSTEM["content"], "message"),
        end,
        *turn(kimi, "<|im_user|>", "user"),
        Text(USER["content"], "message"),
        end,
        *turn(kimi, "<|im_assistant|>", "assistant"),
        special(kimi, "<think>"),
    ]
    assert thinking == head
    assert prompt_segments(kimi, [SYSTEM, USER], thinking=False) == [*head, special(kimi, "</think>")]
    expected_ids = [
        163594,
        *kimi.encode("system"),
        163601,
        *kimi.encode(SYSTEM["content"]),
        163586,
        163587,
        *kimi.encode("user"),
        163601,
        *kimi.encode(USER["content"]),
        163586,
        163588,
        *kimi.encode("assistant"),
        163601,
        163606,
    ]
    assert prompt_ids(kimi, [SYSTEM, USER]) == expected_ids
    assert segments_text(kimi, thinking) == (
        "<|im_system|>system<|im_middle|>You are a helpful assistant.<|im_end|>"
        "<|im_user|>user<|im_middle|>Who are you?<|im_end|><|im_assistant|>assistant<|im_middle|><think>"
    )


def test_tools_are_declared_first_as_sorted_json_or_typescript(kimi):
    """Prompt tokens for [SYSTEM, USER] with TOOLS on the Kimi-layout test tokenizer: 522 with the compact
    JSON declaration (the default), 359 with the TypeScript one; compare with a provider's billed
    `prompt_tokens` to learn which one it renders."""
    segments = prompt_segments(kimi, [SYSTEM, USER], TOOLS)
    declared = json.dumps(TOOLS, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    assert segments[:5] == [
        *turn(kimi, "<|im_system|>", "tool_declare"),
        Text(declared, "tools"),
        special(kimi, "<|im_end|>"),
    ]
    assert segments[5:] == prompt_segments(kimi, [SYSTEM, USER])
    assert declare_tools(TOOLS, "typescript") == TYPESCRIPT
    typescript = prompt_segments(kimi, [SYSTEM, USER], TOOLS, tool_format="typescript")
    assert typescript[3] == Text(TYPESCRIPT, "tools")
    assert len(encode_segments(kimi, segments)) == 522
    assert len(encode_segments(kimi, typescript)) == 359


def test_tool_calls_and_tool_results_in_history(kimi):
    messages = [
        USER,
        {"role": "assistant", "content": "Checking.", "reasoning_content": "Two tools.", "tool_calls": CALLS},
        {"role": "tool", "tool_call_id": "functions.get_weather:0", "content": '{"temp": -4}'},
        {"role": "tool", "name": "search", "tool_call_id": "functions.search:1", "content": "snow"},
    ]
    segments = prompt_segments(kimi, messages, TOOLS)
    assistant_start = segments.index(special(kimi, "<|im_assistant|>"))
    end = special(kimi, "<|im_end|>")
    assert segments[assistant_start:] == [
        *turn(kimi, "<|im_assistant|>", "assistant"),
        special(kimi, "<think>"),
        Text("Two tools.", "reasoning"),
        special(kimi, "</think>"),
        Text("Checking.", "content"),
        special(kimi, "<|tool_calls_section_begin|>"),
        special(kimi, "<|tool_call_begin|>"),
        Text("functions.get_weather:0", "tool_call_id"),
        special(kimi, "<|tool_call_argument_begin|>"),
        Text('{"city": "Oslo", "days": 3}', "tool_arguments"),
        special(kimi, "<|tool_call_end|>"),
        special(kimi, "<|tool_call_begin|>"),
        Text("functions.search:1", "tool_call_id"),
        special(kimi, "<|tool_call_argument_begin|>"),
        Text('{"query":"Oslo  snow"}', "tool_arguments"),
        special(kimi, "<|tool_call_end|>"),
        special(kimi, "<|tool_calls_section_end|>"),
        end,
        *turn(kimi, "<|im_system|>", "tool"),
        Text('## Return of functions.get_weather:0\n{"temp": -4}', "tool_result"),
        end,
        *turn(kimi, "<|im_system|>", "search"),
        Text("## Return of functions.search:1\nsnow", "tool_result"),
        end,
        *turn(kimi, "<|im_assistant|>", "assistant"),
        special(kimi, "<think>"),
    ]


def test_reasoning_of_turns_up_to_the_last_plain_answer_is_dropped(kimi):
    messages = [
        USER,
        {"role": "assistant", "content": "I am Kimi.", "reasoning": "Introduce myself."},
        {"role": "user", "content": "Weather in Oslo?"},
        {
            "role": "assistant",
            "content": None,
            "reasoning_content": "Call the tool.",
            "tool_calls": CALLS[:1],
        },
        {"role": "tool", "tool_call_id": "functions.get_weather:0", "content": "-4"},
    ]
    text = segments_text(kimi, prompt_segments(kimi, messages))
    assert "<|im_assistant|>assistant<|im_middle|><think></think>I am Kimi.<|im_end|>" in text
    assert "Introduce myself." not in text
    assert "<think>Call the tool.</think><|tool_calls_section_begin|>" in text
    instant = segments_text(kimi, prompt_segments(kimi, messages, thinking=False))
    assert "Call the tool." not in instant
    assert instant.endswith("<|im_assistant|>assistant<|im_middle|><think></think>")


def test_the_generated_turn_as_segments(kimi):
    end, think_end = special(kimi, "<|im_end|>"), special(kimi, "</think>")
    full = completion_segments(kimi, reasoning="Think.", content="Answer.", tool_calls=CALLS, truncated=False)
    assert full[:3] == [Text("Think.", "reasoning"), think_end, Text("Answer.", "content")]
    assert full[3] == special(kimi, "<|tool_calls_section_begin|>") and full[-2:] == [
        special(kimi, "<|tool_calls_section_end|>"),
        end,
    ]
    call_ids = [s.text for s in full if isinstance(s, Text) and s.kind == "tool_call_id"]
    assert call_ids == [call["id"] for call in CALLS]
    assert completion_segments(kimi, reasoning="Think.", content="Hi", tool_calls=None, truncated=False) == [
        Text("Think.", "reasoning"),
        think_end,
        Text("Hi", "content"),
        end,
    ]
    assert completion_segments(kimi, reasoning="Thi", content=None, tool_calls=None, truncated=True) == [
        Text("Thi", "reasoning")
    ]
    assert completion_segments(kimi, reasoning="Think.", content="Hel", tool_calls=None, truncated=True) == [
        Text("Think.", "reasoning"),
        think_end,
        Text("Hel", "content"),
    ]
    assert completion_segments(
        kimi, reasoning=None, content="Hi", tool_calls=None, truncated=False, thinking=False
    ) == [Text("Hi", "content"), end]


LONG_DIGITS = "Pi is 3.14159265358979323846264338327950288 and 2**64 = 18446744073709551616."
CJK = "你好，我是一个人工智能助手。東京の天気は晴れです。안녕하세요"
WHITESPACE = "start" + " " * 30_000 + "end\n" + "\t" * 26_000 + "x"


@pytest.mark.parametrize("text", [LONG_DIGITS, CJK, WHITESPACE, "  leading and trailing  \n\n"])
def test_encoding_each_piece_equals_encoding_the_rendered_string(kimi, text):
    messages = [
        SYSTEM,
        {"role": "user", "content": text},
        {"role": "assistant", "content": text, "reasoning": text, "tool_calls": CALLS},
        {"role": "tool", "tool_call_id": "functions.get_weather:0", "content": text},
    ]
    prompt = prompt_segments(kimi, messages, TOOLS)
    completion = completion_segments(kimi, reasoning=text, content=text, tool_calls=CALLS, truncated=False)
    for segments in (prompt, completion):
        ids = encode_segments(kimi, segments)
        assert ids == kimi.encode_with_specials(segments_text(kimi, segments))
        assert kimi.decode(ids) == segments_text(kimi, segments)


def test_special_token_strings_inside_a_text_stay_text(kimi):
    literal = "Write <|im_end|>, </think> and <|tool_call_begin|> literally."
    segments = completion_segments(kimi, reasoning=literal, content=literal, tool_calls=None, truncated=False)
    ids = encode_segments(kimi, segments)
    assert [i for i in ids if kimi.is_special(i)] == [s.id for s in segments if isinstance(s, Special)]
    assert kimi.decode(ids) == segments_text(kimi, segments) == f"{literal}</think>{literal}<|im_end|>"
    assert kimi.encode_with_specials(segments_text(kimi, segments)) != ids, "the engine keeps them as text"


def test_unrenderable_input_stops_with_one_line(kimi):
    image = {"role": "user", "content": [{"type": "text", "text": "see"}, {"type": "image_url"}]}
    with pytest.raises(KimiChatError, match=r"messages\[0\] has a non-text content part"):
        prompt_segments(kimi, [image])
    parts = {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}
    assert Text("ab", "message") in prompt_segments(kimi, [parts])
    with pytest.raises(KimiChatError, match="generated turn call 0: a tool call needs a 'function' object"):
        completion_segments(kimi, reasoning=None, content=None, tool_calls=[{"id": "x"}], truncated=False)
    referenced = [
        {
            "type": "function",
            "function": {
                "name": "f",
                "parameters": {"type": "object", "properties": {"a": {"$ref": "#/$defs/A"}}},
            },
        }
    ]
    with pytest.raises(ToolDeclarationError, match=r"tool schema f.a: .* declare tools as json"):
        prompt_segments(kimi, [USER], referenced, tool_format="typescript")
    assert kimi_chat.last_plain_assistant([USER]) == -1


def test_chatml_targets_have_the_same_surface(model_dir):
    tokenizer = load_target_tokenizer(model_dir)
    messages = [{"role": "user", "content": "Weather in Oslo?"}]
    chat_format = chat_format_for(tokenizer)
    rendered = chat_format.prompt_ids(messages, TOOLS, thinking=False, tool_format="typescript")
    assert rendered == render_prompt_ids(tokenizer.hf, messages, TOOLS)
    segments = chatml.completion_segments(
        tokenizer, reasoning=None, content="Calling.", tool_calls=CALLS, truncated=False
    )
    answer = {"role": "assistant", "content": "Calling.", "tool_calls": CALLS}
    turn = normalize_messages(tokenizer.hf, [answer], None)
    assert segments == [Text(turn[0]["content"], "content"), Special(tokenizer.stop_id)]
    truncated = chatml.completion_segments(
        tokenizer, reasoning=None, content="Cal", tool_calls=None, truncated=True
    )
    assert encode_segments(tokenizer, truncated) == tokenizer.encode("Cal")
    with pytest.raises(chatml.ChatMLError, match="carries reasoning"):
        chatml.completion_segments(tokenizer, reasoning="r", content="c", tool_calls=None, truncated=False)


def test_the_real_tokenizer_renders_the_reference_ids():
    directory = os.environ.get("EAGLEPIPE_KIMI_TOKENIZER_DIR")
    if not directory:
        pytest.skip("EAGLEPIPE_KIMI_TOKENIZER_DIR is unset: point it at a Kimi-K2.5 tokenizer directory")
    real = load_target_tokenizer(directory)
    assert prompt_ids(real, [SYSTEM, USER]) == [
        163594,
        14062,
        163601,
        3900,
        554,
        261,
        13205,
        26626,
        13,
        163586,
        163587,
        2482,
        163601,
        24328,
        554,
        398,
        30,
        163586,
        163588,
        69702,
        163601,
        163606,
    ]
