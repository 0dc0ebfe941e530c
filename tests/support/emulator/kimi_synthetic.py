"""A seeded corpus of Kimi-K2.5-shaped completions with their true ids: ground truth for the token stage.

Each sample is a conversation (tools, multi-turn history with tool calls and results, CJK, long digit and
whitespace runs, special-token strings as plain text) and what a model answering in Kimi's structure
generated: `reasoning </think> content [tool section] <|im_end|>`, as ids. Some answers are deliberately
hard to rebuild from text, and each says how in `hazards`: whitespace next to special tokens (which some
engines strip), tool ids numbered from 0 (which some engines renumber), arguments with surrounding
whitespace (which engines trim), a missing `</think>`, a cut inside a tool call or a character, and
non-canonical splits (a token split into two that BPE would merge, or two tokens split at another byte).
`bytes_of_characters` spells a sample's non-ASCII tokens byte by byte (tokens that are parts of a character).
`reply_record` turns a sample into the responses.jsonl record an engine switch (`text_like`) would leave.
"""

from __future__ import annotations

import hashlib
import json
import random
from dataclasses import dataclass, replace
from functools import cache
from typing import Any

import regex

from eaglepipe.emulator.text_like import EngineReply, EngineSwitch, engine_reply
from eaglepipe.messages import Message, Tool, ToolCall
from eaglepipe.target import kimi_chat
from eaglepipe.target.chat_format import ChatFormat, chat_format_for
from eaglepipe.target.kimi_layout import layout_corpus
from eaglepipe.target.kimi_tools import ToolFormat
from eaglepipe.target.tokenizer import TargetTokenizer

# What text alone cannot show, by the engine habit that hides it (tests read this to judge a rebuild).
HIDDEN_BY_STRIP = frozenset({"reasoning_edge_whitespace", "content_edge_whitespace", "cut_after_whitespace"})
HIDDEN_BY_TRIM = frozenset({"argument_whitespace"})
HIDDEN_BY_RENUMBER = frozenset({"tool_id_restart"})
NON_CANONICAL = frozenset({"noncanonical_longer", "noncanonical_same_count"})
LITERAL_SPECIALS = ("<|im_end|>", "<think>", "[EOS]", "<|im_user|>")
EDGE_WHITESPACE = ("\n", "\n\n", " ", "\n  ")

TOOLS: list[Tool] = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather for a city.",
            "parameters": {
                "type": "object",
                "required": ["city"],
                "properties": {
                    "city": {"type": "string", "description": "City name"},
                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
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
                "properties": {"query": {"type": "string"}, "limit": {"type": "integer", "minimum": 1}},
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "run_python",
            "description": "Run Python code and return its output.",
            "parameters": {
                "type": "object",
                "required": ["code"],
                "properties": {"code": {"type": "string"}},
            },
        },
    },
]


@dataclass(frozen=True)
class TrueSample:
    """`ids` is what the model generated after the prompt, the stop token last when `stopped`."""

    prompt: dict[str, Any]
    thinking: bool
    ids: list[int]
    stopped: bool
    tool_history: int
    hazards: frozenset[str]
    prompt_lengths: dict[str, int]  # rendered prompt length per tool-declaration format

    @property
    def answer_ids(self) -> list[int]:
        return self.ids[:-1] if self.stopped else self.ids


@cache
def _vocabulary() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """English words and Han characters of the layout corpus: text the test tokenizer has tokens for."""
    corpus = layout_corpus()
    words = tuple(sorted(set(regex.findall(r"[A-Za-z][a-z']{1,11}", corpus))))
    han = tuple(sorted(set(regex.findall(r"\p{Han}", corpus))))
    return words, han


class _Writer:
    """Random text in the mixes a chat model writes."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.words, self.han = _vocabulary()

    def sentence(self) -> str:
        rng = self.rng
        words = [rng.choice(self.words) for _ in range(rng.randrange(3, 14))]
        words[0] = words[0].capitalize()
        if rng.random() < 0.2:
            words.insert(rng.randrange(len(words)), str(rng.randrange(10 ** rng.randrange(1, 7))))
        return " ".join(words) + rng.choice(".!?:;,")

    def oddity(self) -> str:
        """One of the runs tokenizers treat specially."""
        rng = self.rng
        kind = rng.randrange(6)
        if kind == 0:
            return "".join(rng.choice(self.han) for _ in range(rng.randrange(2, 30))) + rng.choice("，。、")
        if kind == 1:
            return "".join(rng.choice("0123456789") for _ in range(rng.randrange(20, 90)))
        if kind == 2:
            return "\n" + " " * rng.randrange(8, 70) + "x = " + str(rng.randrange(1000))
        if kind == 3:
            return rng.choice(LITERAL_SPECIALS)
        if kind == 4:
            return "\t" * rng.randrange(2, 6) + "return " + rng.choice(self.words) + "\n\n\n"
        return json.dumps(
            {rng.choice(self.words): rng.randrange(100), "中文": rng.choice(self.han)}, ensure_ascii=False
        )

    def text(self, sentences: int) -> str:
        parts = []
        for _ in range(sentences):
            parts.append(self.sentence())
            if self.rng.random() < 0.25:
                parts.append(self.oddity())
            if self.rng.random() < 0.2:
                parts.append("\n\n")
        return " ".join(parts).replace(" \n\n ", "\n\n")

    def arguments(self, name: str) -> str:
        rng = self.rng
        values = {
            "get_weather": lambda: {"city": rng.choice(["Oslo", "北京", "東京", "Lima"]), "unit": "celsius"},
            "search": lambda: {"query": self.sentence(), "limit": rng.randrange(1, 20)},
            "run_python": lambda: {"code": "print(" + str(rng.randrange(10**12)) + ")\n"},
        }[name]()
        return json.dumps(values, ensure_ascii=False)


def _history(writer: _Writer, rng: random.Random, tools: bool) -> tuple[list[Message], int]:
    """Earlier turns, some with tool calls and their results; returns them and the calls made."""
    messages: list[Message] = []
    calls = 0
    for _ in range(rng.randrange(0, 3)):
        messages.append({"role": "user", "content": writer.text(rng.randrange(1, 3))})
        if tools and rng.random() < 0.6:
            made: list[ToolCall] = []
            for _ in range(rng.randrange(1, 3)):
                name = rng.choice(TOOLS)["function"]["name"]
                made.append(
                    {
                        "id": f"functions.{name}:{calls}",
                        "type": "function",
                        "function": {"name": name, "arguments": writer.arguments(name)},
                    }
                )
                calls += 1
            messages.append(
                {"role": "assistant", "content": "", "tool_calls": made, "reasoning_content": writer.text(1)}
            )
            messages += [{"role": "tool", "tool_call_id": c["id"], "content": writer.text(1)} for c in made]
            messages.append({"role": "assistant", "content": writer.text(rng.randrange(1, 3))})
        else:
            messages.append({"role": "assistant", "content": writer.text(rng.randrange(1, 3))})
    return messages, calls


def _edge(rng: random.Random, probability: float) -> str:
    return rng.choice(EDGE_WHITESPACE) if rng.random() < probability else ""


def _sample(
    chat_format: ChatFormat, rng: random.Random, index: int, splitter: _Splitter, length: int
) -> TrueSample:
    tokenizer = chat_format.tokenizer
    writer = _Writer(rng)
    markers = kimi_chat.Markers.of(tokenizer)
    with_tools = rng.random() < 0.55
    messages, history = _history(writer, rng, with_tools)
    if rng.random() < 0.3:
        messages.insert(0, {"role": "system", "content": writer.text(1)})
    messages.append({"role": "user", "content": writer.text(rng.randrange(1, 4))})
    tools = rng.sample(TOOLS, rng.randrange(1, 4)) if with_tools else None
    thinking = rng.random() < 0.9
    hazards: set[str] = set()
    pieces: list[int | str] = []  # text pieces and special ids, in order

    def text(value: str, edge_hazard: str | None, lead_p: float, trail_p: float) -> None:
        whole = _edge(rng, lead_p) + value + _edge(rng, trail_p)
        if edge_hazard and whole != whole.strip():
            hazards.add(edge_hazard)
        if whole:
            pieces.append(whole)

    calls = (
        [rng.choice(tools)["function"]["name"] for _ in range(rng.randrange(1, 4))]
        if (tools and rng.random() < 0.6)
        else []
    )
    if thinking:
        text(writer.text(rng.randrange(1, 12) * length), "reasoning_edge_whitespace", 0.1, 0.25)
        if calls and rng.random() < 0.05:
            hazards.add("missing_think_end")
        else:
            pieces.append(markers.think_end)
    if "missing_think_end" not in hazards:
        content = writer.text(rng.randrange(1, 10) * length) if not calls or rng.random() < 0.6 else ""
        text(content, "content_edge_whitespace", 0.3 if thinking else 0.0, 0.1)
    if calls:
        restart = history > 0 and rng.random() < 0.2
        hazards |= {"tool_id_restart"} if restart else set()
        pieces.append(markers.section_begin)
        for number, name in enumerate(calls):
            pieces += [
                markers.call_begin,
                f"functions.{name}:{number if restart else history + number}",
                markers.argument_begin,
            ]
            arguments = writer.arguments(name)
            padded = _edge(rng, 0.05) + arguments + _edge(rng, 0.05)
            hazards |= {"argument_whitespace"} if padded != arguments else set()
            pieces += [padded, markers.call_end]
        pieces.append(markers.section_end)
    ids = [i for piece in pieces for i in (tokenizer.encode(piece) if isinstance(piece, str) else [piece])]
    ids = splitter.mutate(ids, rng, hazards)
    stopped = rng.random() >= 0.15
    if stopped:
        ids.append(markers.end)
    else:
        ids = ids[: rng.randrange(1, len(ids))] if len(ids) > 1 else ids
        hazards |= _cut_hazards(tokenizer, ids, markers)
    prompt: dict[str, Any] = {"messages": messages, **({"tools": tools} if tools else {})}
    prompt["id"] = hashlib.sha256(f"{index} {json.dumps(prompt, sort_keys=True)}".encode()).hexdigest()[:16]
    lengths = {
        f: len(chat_format.prompt_ids(messages, tools, thinking=thinking, tool_format=f))
        for f in (("typescript", "json") if tools else ("typescript",))
    }
    return TrueSample(prompt, thinking, ids, stopped, history, frozenset(hazards), lengths)


def _cut_hazards(tokenizer: TargetTokenizer, ids: list[int], markers: kimi_chat.Markers) -> set[str]:
    found = set()
    tail = b"".join(tokenizer.token_bytes(i) for i in ids[-4:] if not tokenizer.is_special(i))
    try:
        tail.decode("utf-8")
    except UnicodeDecodeError:
        found.add("cut_in_character")
    last_text = ids[
        len(ids) - next((k for k, i in enumerate(reversed(ids)) if tokenizer.is_special(i)), len(ids)) :
    ]
    if tokenizer.decode(last_text)[-1:].isspace():
        found.add("cut_after_whitespace")
    opened = [i for i in ids if i in (markers.call_begin, markers.call_end)]
    if opened and opened[-1] == markers.call_begin:
        found.add("cut_in_tool_call")
    return found


class _Splitter:
    """Non-canonical re-splits of text tokens into other tokens with the same bytes."""

    def __init__(self, tokenizer: TargetTokenizer) -> None:
        self.tokenizer = tokenizer
        self.rank_of: dict[bytes, int] = {}
        for token_id in range(tokenizer.vocab_size):
            if not tokenizer.is_special(token_id):
                self.rank_of.setdefault(tokenizer.token_bytes(token_id), token_id)

    def mutate(self, ids: list[int], rng: random.Random, hazards: set[str]) -> list[int]:
        if rng.random() < 0.12 and self._split_one(ids, rng):
            hazards.add("noncanonical_longer")
        if rng.random() < 0.08 and self._move_boundary(ids, rng):
            hazards.add("noncanonical_same_count")
        return ids

    def _splits(self, raw: bytes, avoid: int = -1) -> list[tuple[int, int]]:
        return [
            (self.rank_of[raw[:s]], self.rank_of[raw[s:]])
            for s in range(1, len(raw))
            if s != avoid and raw[:s] in self.rank_of and raw[s:] in self.rank_of
        ]

    def _split_one(self, ids: list[int], rng: random.Random) -> bool:
        """One token replaced by two whose bytes join to it (BPE would have merged them): one id more."""
        for position in rng.sample(range(len(ids)), min(len(ids), 40)):
            if self.tokenizer.is_special(ids[position]):
                continue
            options = self._splits(self.tokenizer.token_bytes(ids[position]))
            if options:
                ids[position : position + 1] = list(rng.choice(options))
                return True
        return False

    def _move_boundary(self, ids: list[int], rng: random.Random) -> bool:
        """Two neighbours re-split at another byte: the same count, other ids."""
        for position in rng.sample(range(len(ids) - 1), min(len(ids) - 1, 40)):
            pair = ids[position : position + 2]
            if any(self.tokenizer.is_special(i) for i in pair):
                continue
            first = self.tokenizer.token_bytes(pair[0])
            options = self._splits(first + self.tokenizer.token_bytes(pair[1]), avoid=len(first))
            if options:
                ids[position : position + 2] = list(rng.choice(options))
                return True
        return False


def kimi_corpus(tokenizer: TargetTokenizer, count: int, seed: int = 0, length: int = 1) -> list[TrueSample]:
    """`count` samples, the same for the same tokenizer, seed and `length` (a multiplier of the number of
    sentences in reasoning and content)."""
    rng = random.Random(seed)
    splitter = _Splitter(tokenizer)
    chat_format = chat_format_for(tokenizer)
    return [_sample(chat_format, rng, index, splitter, length) for index in range(count)]


def bytes_of_characters(tokenizer: TargetTokenizer, samples: list[TrueSample]) -> list[TrueSample]:
    """The samples that hold a non-ASCII token, each such token spelled byte by byte, as a byte-level BPE
    writes a character it has no merge for (Kimi's vocabulary does so for rare characters): tokens that
    are parts of a character."""
    single = _Splitter(tokenizer).rank_of
    spelled_samples = []
    for sample in samples:
        ids: list[int] = []
        for token_id in sample.ids:
            raw = b"" if tokenizer.is_special(token_id) else tokenizer.token_bytes(token_id)
            spelled = [single.get(raw[k : k + 1]) for k in range(len(raw))] if not raw.isascii() else []
            ranks = [rank for rank in spelled if rank is not None]
            ids += ranks if spelled and len(ranks) == len(spelled) else [token_id]
        if ids != sample.ids:
            spelled_samples.append(replace(sample, ids=ids, hazards=sample.hazards | {"bytes_of_characters"}))
    return spelled_samples


def reply_record(tokenizer: TargetTokenizer, sample: TrueSample, switch: EngineSwitch) -> dict[str, Any]:
    """The responses.jsonl record a provider running `switch` would leave for this sample."""
    reply = engine_reply(
        tokenizer,
        sample.answer_ids,
        switch,
        stopped=sample.stopped,
        thinking=sample.thinking,
        tool_history=sample.tool_history,
    )
    tool_format: ToolFormat = switch.prompt_tool_format if "tools" in sample.prompt else "typescript"
    prompt_tokens = sample.prompt_lengths[tool_format] + switch.injected_prompt_tokens
    return sample_record(sample, reply, switch.name, prompt_tokens)


def sample_record(
    sample: TrueSample, reply: EngineReply, provider: str, prompt_tokens: int
) -> dict[str, Any]:
    """The responses.jsonl record of `reply` to the sample's prompt (asked without thinking if instant)."""
    request: dict[str, Any] = {"model": "moonshotai/kimi-k2.5"}
    if not sample.thinking:
        request["reasoning"] = {"enabled": False}
    return {
        "prompt_id": sample.prompt["id"],
        "request": request,
        "response": reply.response(),
        "provider": provider,
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": reply.completion_tokens,
            "reasoning_tokens": 0,
            "cost": 0.0,
        },
    }
