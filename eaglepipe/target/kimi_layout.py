"""A small tokenizer directory in Kimi-K2.5's exact layout, for tests, the emulator and benchmarks.

The real `tiktoken.model` ships only with the model's weights. This one has a small byte-level BPE core
learned from a built-in multilingual corpus, padded with filler ranks to exactly Kimi's 163,584 ranks, then
Kimi's real special table; so the loader, the size check and every absolute special id behave as with
the real file. A filler token holds an ASCII digit followed by a letter, which Kimi's split pattern never
puts in one piece, so no text can ever encode to a filler id.
"""

from __future__ import annotations

import base64
import hashlib
import heapq
import json
import os
import random
import shutil
import tempfile
from collections import Counter
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import regex

from eaglepipe.target.kimi_tokenizer import KIMI_NUM_RANKS, KIMI_PAT_STR, KIMI_SPECIAL_TOKENS

LAYOUT_VERSION = 1
LEARNED_TOKENS = 3_000
STAMP = "eaglepipe-kimi-layout.json"
# The template's markers that Moonshot's config marks `special: false` (they are tiktoken specials anyway).
NOT_HF_SPECIAL = {"<|tool_calls_section_begin|>", "<|tool_calls_section_end|>", "<|tool_call_begin|>",
                  "<|tool_call_argument_begin|>", "<|tool_call_end|>", "<think>", "</think>"}

_PROSE = """\
You are a helpful assistant. Who are you? I am a language model, and I answer questions about code,
mathematics, science and the world. The pipeline buys responses, rebuilds the exact token ids, extracts
hidden states and trains a small draft model that proposes several tokens at once; the target checks them
in one forward pass, so generation gets faster without changing a single output token.
It's the user's request that matters: they'd like a short answer, we're careful, and you'll see why.
Speculative decoding works because most tokens are easy. When the draft is right, three or four tokens are
accepted per step; when it is wrong, the target's own token is kept and nothing is lost. Training data must
therefore match what the target really generated, including its reasoning, its tool calls and its stops.
The weather in Oslo is cold today: minus four degrees, light snow, and a strong wind from the north.
Please call the search tool with the query, then summarize the results in two sentences.
"""
_CODE = '''\
def fibonacci(n: int) -> list[int]:
    """The first n Fibonacci numbers."""
    values = [0, 1]
    while len(values) < n:
        values.append(values[-1] + values[-2])
    return values[:n]


class Cache:
    def __init__(self, capacity: int = 128) -> None:
        self.capacity = capacity
        self.items: dict[str, bytes] = {}

    def get(self, key: str) -> bytes | None:
        return self.items.get(key)


if __name__ == "__main__":
    for i in range(10):
        print(f"{i:>3} {fibonacci(i)}")
\tif (x != 0 && y >= 10) { return x * y; } else { return -1; }
#include <stdio.h>
int main(void) { printf("hello, world\\n"); return 0; }
$ pip install -c constraints.txt -e '.[dev]' && python -m pytest tests/ -x -q
SELECT id, name FROM users WHERE created_at > '2024-01-01' ORDER BY id DESC LIMIT 20;
'''
_CJK = """\
你好，我是一个人工智能助手。今天的天气很好，我们去公园散步吧。请帮我查一下北京明天的天气。
机器学习是人工智能的一个分支，它让计算机从数据中学习规律。模型的参数越多，训练需要的数据也越多。
中文、日本語、한국어。こんにちは、元気ですか？東京の天気は晴れです。ありがとうございます。
안녕하세요, 만나서 반갑습니다. 오늘 날씨가 좋네요. 감사합니다.
"""
_OTHER = """\
Привет, как дела? Сегодня хорошая погода. Die Straße ist schön, über den Brücken. Ça va très bien, merci.
¿Dónde está la estación? Añadir más café. Ελληνικά γράμματα. مرحبا بالعالم. नमस्ते दुनिया.
∑ x² + √y ≈ 3.14159 ± 0.001 → ∞ ≤ ≥ ≠ × ÷ € £ ¥ © ® ™ … “quoted” ‘single’ — dash – en-dash 😀 🚀 ✅ ❤️
"""


def layout_corpus() -> str:
    """Handwritten multilingual text plus deterministic generated prose, numbers, JSON and indentation."""
    rng = random.Random(LAYOUT_VERSION)
    words = regex.findall(r"[A-Za-z']+", _PROSE + _CODE)
    lower = [word.lower() for word in words]
    prose = " ".join(rng.choice(words) for _ in range(6_000))
    sentences = ". ".join(s.strip().capitalize() for s in prose.split(" the ")) + "."
    identifiers = " ".join(f"{rng.choice(lower)}_{rng.choice(lower)} {rng.choice(words).upper()}"
                           for _ in range(1_500))
    han = [char for char in _CJK if regex.match(r"\p{Han}", char)]
    han_runs = "，".join("".join(rng.choices(han, k=rng.randrange(1, 5))) for _ in range(1_500))
    numbers = " ".join(
        [str(n) for n in range(1_000)]
        + [f"{rng.randrange(10**9)} {rng.random() * 1000:.2f} 20{rng.randrange(10, 30)}" for _ in range(400)]
    )
    records = [
        {"id": f"p-{i}", "name": rng.choice(words), "score": rng.randrange(100), "tags": rng.sample(words, 2),
         "ok": bool(i % 2), "parent": None}
        for i in range(150)
    ]
    json_text = json.dumps(records[:75], indent=2) + json.dumps(records[75:], separators=(",", ":"))
    indents = "".join(f"\n{' ' * width}x = {width}" + "\t" * (width % 3) for width in range(33))
    handwritten = (_PROSE + _CODE + _CJK + _OTHER) * 2
    return "\n".join([handwritten, sentences, identifiers, han_runs, numbers, json_text, indents * 4])


@cache
def _splitter() -> regex.Pattern[str]:
    return regex.compile(KIMI_PAT_STR, flags=regex.V1)


def piece_counts(text: str) -> Counter[bytes]:
    """How often each pre-split piece occurs, as UTF-8 bytes (BPE never merges across pieces)."""
    return Counter(piece.encode() for piece in _splitter().findall(text))


def learn_merges(pieces: Counter[bytes], max_tokens: int) -> list[bytes]:
    """Byte-level BPE: repeatedly merge the most frequent adjacent pair (ties: smallest pair), keeping
    pair counts incrementally so a few thousand merges take about a second."""
    words = [[bytes([b]) for b in piece] for piece in pieces]
    freqs = list(pieces.values())
    pair_counts: Counter[tuple[bytes, bytes]] = Counter()
    pair_words: dict[tuple[bytes, bytes], set[int]] = {}
    for index, word in enumerate(words):
        for pair in zip(word, word[1:], strict=False):
            pair_counts[pair] += freqs[index]
            pair_words.setdefault(pair, set()).add(index)
    heap = [(-count, pair) for pair, count in pair_counts.items()]
    heapq.heapify(heap)
    learned: list[bytes] = []
    seen: set[bytes] = {bytes([b]) for b in range(256)}
    while heap and len(learned) < max_tokens:
        negative, pair = heapq.heappop(heap)
        if pair_counts.get(pair) != -negative:
            continue
        if -negative < 2:
            break
        merged = pair[0] + pair[1]
        if merged not in seen:
            seen.add(merged)
            learned.append(merged)
        touched: set[tuple[bytes, bytes]] = set()
        for index in pair_words.pop(pair):
            touched |= _merge_in_word(words, index, pair, freqs[index], pair_counts, pair_words)
        del pair_counts[pair]
        for other in touched - {pair}:
            heapq.heappush(heap, (-pair_counts[other], other))
    return learned


def _merge_in_word(
    words: list[list[bytes]],
    index: int,
    pair: tuple[bytes, bytes],
    freq: int,
    pair_counts: Counter[tuple[bytes, bytes]],
    pair_words: dict[tuple[bytes, bytes], set[int]],
) -> set[tuple[bytes, bytes]]:
    """Merge `pair` everywhere in one word, moving its pair counts; returns the pairs whose count changed."""
    word = words[index]
    old_pairs = list(zip(word, word[1:], strict=False))
    merged: list[bytes] = []
    position = 0
    while position < len(word):
        if position + 1 < len(word) and (word[position], word[position + 1]) == pair:
            merged.append(word[position] + word[position + 1])
            position += 2
        else:
            merged.append(word[position])
            position += 1
    new_pairs = list(zip(merged, merged[1:], strict=False))
    for old in old_pairs:
        pair_counts[old] -= freq
    for new in new_pairs:
        pair_counts[new] += freq
        pair_words.setdefault(new, set()).add(index)
    words[index] = merged
    return set(old_pairs) | set(new_pairs)


def filler_tokens(count: int) -> list[bytes]:
    """`0z`, `1z`, ...: a digit then a letter never share a pre-split piece, so these are unreachable."""
    return [f"{i}z".encode() for i in range(count)]


@cache
def layout_ranks() -> tuple[bytes, ...]:
    """Every rank's bytes in rank order: 256 single bytes, the learned tokens, then fillers up to 163,584."""
    learned = learn_merges(piece_counts(layout_corpus()), LEARNED_TOKENS)
    core = [bytes([b]) for b in range(256)] + learned
    return tuple(core + filler_tokens(KIMI_NUM_RANKS - len(core)))


@dataclass(frozen=True)
class KimiLayout:
    directory: Path
    reachable_ranks: int  # ranks below this can appear in encoded text; the rest are fillers


def tokenizer_config() -> dict:
    """The parts of Moonshot's `tokenizer_config.json` the loader reads, plus its bos/eos/pad/unk names."""
    decoder = {
        str(token_id): {"content": name, "lstrip": False, "normalized": False, "rstrip": False,
                        "single_word": False, "special": name not in NOT_HF_SPECIAL}
        for token_id, name in KIMI_SPECIAL_TOKENS.items()
    }
    return {"added_tokens_decoder": decoder, "bos_token": "[BOS]", "eos_token": "[EOS]", "pad_token": "[PAD]",
            "unk_token": "[UNK]", "model_max_length": 262144, "tokenizer_class": "TikTokenTokenizer"}


def layout_fingerprint() -> str:
    """Changes whenever the built files would: the corpus, the learned size, the format."""
    recipe = json.dumps([LAYOUT_VERSION, LEARNED_TOKENS, layout_corpus(), tokenizer_config()])
    return hashlib.sha256(recipe.encode()).hexdigest()[:16]


def write_kimi_layout(directory: str | Path) -> KimiLayout:
    """Build the directory afresh (`tiktoken.model`, `tokenizer_config.json`, a stamp), replacing it whole."""
    directory = Path(directory)
    ranks = layout_ranks()
    reachable = ranks.index(filler_tokens(1)[0])
    directory.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{directory.name}-", dir=directory.parent))
    staging.chmod(0o755)
    lines = (f"{base64.b64encode(token).decode()} {rank}\n" for rank, token in enumerate(ranks))
    (staging / "tiktoken.model").write_text("".join(lines))
    (staging / "tokenizer_config.json").write_text(json.dumps(tokenizer_config(), indent=2))
    stamp = {"fingerprint": layout_fingerprint(), "reachable_ranks": reachable}
    (staging / STAMP).write_text(json.dumps(stamp))
    if directory.exists():
        shutil.rmtree(directory)
    os.replace(staging, directory)
    return KimiLayout(directory, reachable)


def ensure_kimi_layout(directory: str | Path) -> KimiLayout:
    """The directory as built before when its stamp matches this code, else built now (about a second)."""
    directory = Path(directory)
    try:
        stamp = json.loads((directory / STAMP).read_text())
        if stamp["fingerprint"] == layout_fingerprint() and (directory / "tiktoken.model").is_file():
            return KimiLayout(directory, stamp["reachable_ranks"])
    except (OSError, ValueError, KeyError):
        pass
    return write_kimi_layout(directory)
