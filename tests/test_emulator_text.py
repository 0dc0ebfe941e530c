"""Streamed text deltas and logprob bytes must rebuild exactly what the non-streamed answer says."""

from __future__ import annotations

import pytest

from eaglepipe.emulator.text import StreamDecoder, TokenBytes, decode
from eaglepipe.target.load import load_tokenizer

TEXTS = [
    "Café au lait, 日本語 and emoji 🎉🌟 in one line.",
    " leading space\n\nand\ttabs",
    "<|im_end|> inside",
]


@pytest.fixture(scope="module")
def tokenizer(model_dir):
    return load_tokenizer(model_dir)


@pytest.mark.parametrize("text", TEXTS)
def test_stream_deltas_concatenate_to_the_full_decode(tokenizer, text):
    ids = tokenizer(text, add_special_tokens=False).input_ids
    decoder = StreamDecoder(tokenizer)
    deltas = [decoder.push(token_id) for token_id in ids] + [decoder.flush()]
    assert "".join(deltas) == decode(tokenizer, ids) == text
    assert not any("\ufffd" in delta for delta in deltas)


def test_a_cut_character_is_flushed_as_the_full_decode_says(tokenizer):
    ids = tokenizer("🎉", add_special_tokens=False).input_ids
    assert len(ids) > 1, "the emoji must span several tokens for this test to mean anything"
    decoder = StreamDecoder(tokenizer)
    deltas = [decoder.push(token_id) for token_id in ids[:-1]] + [decoder.flush()]
    assert "".join(deltas) == decode(tokenizer, ids[:-1])


@pytest.mark.parametrize("text", TEXTS)
def test_token_bytes_concatenate_to_the_utf8_text(tokenizer, text):
    ids = tokenizer(text, add_special_tokens=False).input_ids
    token_bytes = TokenBytes(tokenizer)
    assert b"".join(token_bytes(token_id) for token_id in ids) == text.encode("utf-8")
