"""Kimi's native tokenizer on a directory in Kimi-K2.5's layout; the HF adapter; the real file when given."""

from __future__ import annotations

import json
import os
import random
import time
from pathlib import Path

import pytest

from eaglepipe.target.hf_tokenizer import HFTokenizer
from eaglepipe.target.kimi_layout import ensure_kimi_layout, filler_tokens, layout_ranks, write_kimi_layout
from eaglepipe.target.kimi_tokenizer import (
    KIMI_NUM_RANKS,
    KIMI_SPECIAL_TOKENS,
    KimiTokenizer,
    split_long_runs,
)
from eaglepipe.target.load import load_target_tokenizer
from eaglepipe.target.tokenizer import TokenizerError

REAL_DIR_VARIABLE = "EAGLEPIPE_KIMI_TOKENIZER_DIR"
MIXED = (
    "Hello, world! It's 2024-06-01.\n\tdef f(x):\n        return x ** 2\n"
    '你好，世界。こんにちは 안녕 Привет 😀 {"a": [1, 2.5]}'
)


@pytest.fixture(scope="module")
def layout(tmp_path_factory):
    return ensure_kimi_layout(tmp_path_factory.getbasetemp() / "kimi-layout")


@pytest.fixture(scope="module")
def kimi(layout) -> KimiTokenizer:
    tokenizer = load_target_tokenizer(layout.directory)
    assert isinstance(tokenizer, KimiTokenizer)
    return tokenizer


def test_the_layout_has_kimis_rank_count_and_special_ids(layout, kimi):
    lines = (layout.directory / "tiktoken.model").read_text().splitlines()
    assert len(lines) == kimi.num_ranks == KIMI_NUM_RANKS
    assert [int(line.split()[1]) for line in lines[:3]] == [0, 1, 2]
    assert kimi.vocab_size == 163_840
    for token_id, name in KIMI_SPECIAL_TOKENS.items():
        assert kimi.special_id(name) == token_id
        assert kimi.decode([token_id]) == name
    assert kimi.special_id("<|reserved_token_163589|>") == 163589
    assert kimi.special_id("<|reserved_token_163837|>") == 163837
    assert kimi.stop_id == 163586
    assert kimi.is_special(163584) and kimi.is_special(163839) and not kimi.is_special(163583)
    config = json.loads((layout.directory / "tokenizer_config.json").read_text())
    assert sorted(map(int, config["added_tokens_decoder"])) == sorted(KIMI_SPECIAL_TOKENS)


def test_building_takes_seconds_and_a_built_directory_is_reused(layout, tmp_path):
    layout_ranks.cache_clear()
    start = time.perf_counter()
    fresh = write_kimi_layout(tmp_path / "fresh")
    assert time.perf_counter() - start < 10
    rank_file = tmp_path / "fresh" / "tiktoken.model"
    assert rank_file.read_bytes() == (layout.directory / "tiktoken.model").read_bytes()
    built_at = rank_file.stat().st_mtime_ns
    assert ensure_kimi_layout(tmp_path / "fresh") == fresh
    assert rank_file.stat().st_mtime_ns == built_at
    assert 2_000 < fresh.reachable_ranks - 256 <= 4_000


def test_text_round_trips_and_token_bytes_spell_it(kimi):
    ids = kimi.encode(MIXED)
    assert kimi.decode(ids) == MIXED
    assert b"".join(kimi.token_bytes(i) for i in ids) == MIXED.encode()
    assert len(ids) < len(MIXED.encode()) / 2, "the learned merges should compress ordinary text"
    assert kimi.token_bytes(163607) == b"</think>"
    with pytest.raises(TokenizerError, match="id 163840 lies outside"):
        kimi.token_bytes(163_840)


def test_special_token_strings_in_text_are_ordinary_text(kimi):
    text = "Type <|im_end|> or </think> literally, then <|reserved_token_163700|>."
    ids = kimi.encode(text)
    assert not any(kimi.is_special(i) for i in ids)
    assert kimi.decode(ids) == text
    assert 163586 in kimi.encode_with_specials(text)
    assert 163607 in kimi.encode_with_specials(text)
    with pytest.raises(TokenizerError, match="names no special token '<|nope|>'"):
        kimi.special_id("<|nope|>")


def test_digits_are_grouped_by_three(kimi):
    digits = "12345678901234"
    ids = kimi.encode(digits)
    lengths = [len(kimi.token_bytes(i)) for i in ids]
    ends = {sum(lengths[: k + 1]) for k in range(len(lengths))}
    assert max(lengths) <= 3 and {3, 6, 9, 12, 14} <= ends


def reference_runs(text: str, max_run: int) -> list[str]:
    """Moonshot's cut as its description reads: a character loop over runs of (non-)whitespace."""
    pieces, start, run, run_is_space = [], 0, 0, text[:1].isspace()
    for index, char in enumerate(text):
        if char.isspace() != run_is_space:
            run, run_is_space = 1, char.isspace()
            continue
        run += 1
        if run > max_run:
            pieces.append(text[start:index])
            start, run = index, 1
    return [*pieces, text[start:]]


def test_long_runs_are_cut_like_the_official_encoder():
    rng = random.Random(7)
    for _ in range(300):
        text = "".join(rng.choice("ab \n\u3000x") for _ in range(rng.randrange(40)))
        for max_run in (1, 2, 3, 5):
            assert split_long_runs(text, max_run) == reference_runs(text, max_run), (text, max_run)


def test_whitespace_runs_longer_than_25000_are_cut_before_bpe(kimi):
    text = "a" + " " * 30_000 + "b"
    first, rest = "a" + " " * 25_000, " " * 5_000 + "b"
    expected = kimi.encoding.encode_ordinary(first) + kimi.encoding.encode_ordinary(rest)
    assert kimi.encode(text) == expected
    assert kimi.encode(text) != kimi.encoding.encode_ordinary(text)
    assert kimi.decode(kimi.encode(text)) == text


def test_input_is_cut_into_windows_of_400000_characters(kimi):
    text = "word " * 80_001
    expected = kimi.encoding.encode_ordinary(text[:400_000]) + kimi.encoding.encode_ordinary(text[400_000:])
    assert kimi.encode(text) == expected
    assert expected != kimi.encoding.encode_ordinary(text), "the cut splits ' word' at the window edge"


def test_filler_ranks_are_unreachable(layout, kimi):
    assert kimi.token_bytes(layout.reachable_ranks) == filler_tokens(1)[0]
    assert kimi.token_bytes(KIMI_NUM_RANKS - 1).endswith(b"z")
    rng = random.Random(11)
    alphabet = "abcxyzABCZ0123456789 _-.,;:'\"()[]{}<>|\n\t  你好世界こんにちはПривет😀"
    text = "".join(rng.choice(alphabet) for _ in range(300_000)) + " 0z 1z 9z 12ab 0x1F 3rd a1b2c3"
    ids = kimi.encode(text)
    assert max(ids) < layout.reachable_ranks
    assert kimi.decode(ids) == text


def write_tokenizer(directory: Path, rank_lines: list[str], names: dict[int, str] | None = None) -> Path:
    directory.mkdir(exist_ok=True)
    (directory / "tiktoken.model").write_text("".join(line + "\n" for line in rank_lines))
    decoder = {str(i): {"content": name} for i, name in (names or {}).items()}
    (directory / "tokenizer_config.json").write_text(json.dumps({"added_tokens_decoder": decoder}))
    return directory


def byte_lines() -> list[str]:
    import base64

    return [f"{base64.b64encode(bytes([b])).decode()} {b}" for b in range(256)]


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda lines: lines[:2] + ["!!!! 2"] + lines[3:], r"model line 3: expected '<base64 token> <rank>'"),
        (lambda lines: lines[:2] + ["Ag=="] + lines[3:], r"model line 3: expected"),
        (lambda lines: lines[:2] + ["YWI= 1"] + lines[3:], r"model line 3: rank 1 already given on line 2"),
        (lambda lines: lines + ["AA== 256"], r"model line 257: this token already has rank 0 \(line 1\)"),
        (lambda lines: lines + ["YWI= 258"], r"model line 257: rank 258 given but rank 256 is missing"),
        (lambda lines: [], r"tiktoken.model holds no ranks"),
    ],
)
def test_a_damaged_rank_file_stops_with_its_line(tmp_path, edit, message):
    directory = write_tokenizer(tmp_path / "tok", edit(byte_lines()))
    with pytest.raises(TokenizerError, match=message):
        load_target_tokenizer(directory)


def test_a_special_table_that_does_not_fit_stops_with_one_line(tmp_path):
    outside = write_tokenizer(tmp_path / "outside", byte_lines(), {256: "<|im_end|>", 600: "<think>"})
    message = r"config.json: added_tokens_decoder\['600'\] \('<think>'\) is outside the special ids 256..511"
    with pytest.raises(TokenizerError, match=message):
        load_target_tokenizer(outside)
    twice = write_tokenizer(tmp_path / "twice", byte_lines(), {256: "<|im_end|>", 257: "<|im_end|>"})
    with pytest.raises(TokenizerError, match="names '<|im_end|>' twice"):
        load_target_tokenizer(twice)
    (twice / "tokenizer_config.json").write_text('{"added_tokens_decoder": {\n"256": }')
    with pytest.raises(TokenizerError, match="tokenizer_config.json line 2: invalid JSON"):
        load_target_tokenizer(twice)
    (twice / "tokenizer_config.json").unlink()
    with pytest.raises(TokenizerError, match="tokenizer_config.json is missing"):
        load_target_tokenizer(twice)


def test_a_shifted_full_size_table_is_the_known_trap(layout, tmp_path):
    """A converted fast tokenizer closes the reserved gaps: `</think>` lands on 163603."""
    directory = tmp_path / "shifted"
    directory.mkdir()
    (directory / "tiktoken.model").symlink_to(layout.directory / "tiktoken.model")
    names = KIMI_SPECIAL_TOKENS.values()
    decoder = {str(163584 + offset): {"content": name} for offset, name in enumerate(names)}
    (directory / "tokenizer_config.json").write_text(json.dumps({"added_tokens_decoder": decoder}))
    with pytest.raises(TokenizerError, match=r"config.json: </think> has id 163604, Kimi-K2.5 uses 163607"):
        load_target_tokenizer(directory)


def test_the_hf_adapter_keeps_special_strings_as_text(model_dir):
    tokenizer = load_target_tokenizer(model_dir)
    assert isinstance(tokenizer, HFTokenizer)
    im_end = tokenizer.special_id("<|im_end|>")
    assert tokenizer.stop_id == im_end and tokenizer.is_special(im_end) and not tokenizer.is_special(1000)
    text = "say <|im_end|> then " + MIXED
    ids = tokenizer.encode(text)
    assert im_end not in ids and im_end in tokenizer.encode_with_specials(text)
    assert tokenizer.decode(ids) == text
    assert b"".join(tokenizer.token_bytes(i) for i in ids) == text.encode()
    assert tokenizer.token_bytes(im_end) == b"<|im_end|>"
    assert tokenizer.vocab_size == 49_152
    with pytest.raises(TokenizerError, match="no added token named '</think>'"):
        tokenizer.special_id("</think>")


@pytest.fixture(scope="module")
def real_kimi() -> KimiTokenizer:
    directory = os.environ.get(REAL_DIR_VARIABLE)
    if not directory:
        pytest.skip(f"{REAL_DIR_VARIABLE} is unset: point it at a Kimi-K2.5 tokenizer directory for real ids")
    tokenizer = load_target_tokenizer(directory)
    assert isinstance(tokenizer, KimiTokenizer)
    return tokenizer


def test_the_real_tokenizer_gives_the_reference_ids(real_kimi):
    assert real_kimi.num_ranks == KIMI_NUM_RANKS
    for token_id, name in KIMI_SPECIAL_TOKENS.items():
        assert real_kimi.special_id(name) == token_id
    assert real_kimi.encode("You are a helpful assistant.") == [3900, 554, 261, 13205, 26626, 13]
    assert real_kimi.encode("Who are you?") == [24328, 554, 398, 30]
    assert real_kimi.encode_with_specials("<|im_system|>system<|im_middle|>") == [163594, 14062, 163601]
    assert real_kimi.encode_with_specials("<|im_user|>user<|im_middle|>") == [163587, 2482, 163601]
    assert real_kimi.encode_with_specials("<|im_assistant|>assistant<|im_middle|>") == [163588, 69702, 163601]
    assert real_kimi.decode(real_kimi.encode(MIXED)) == MIXED
