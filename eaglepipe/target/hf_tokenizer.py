"""The target-tokenizer interface over a Hugging Face tokenizer (the embedded SmolLM2, any HF target)."""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache, cached_property
from typing import Any

from eaglepipe.target.chat import stop_token_id
from eaglepipe.target.tokenizer import TokenizerError


@cache
def byte_level_alphabet() -> dict[str, int]:
    """GPT-2's byte-level BPE spells each byte as one printable character; this maps them back."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1)]
    printable += range(ord("®"), ord("ÿ") + 1)
    spelled = {byte: byte for byte in printable}
    for byte in range(256):
        if byte not in spelled:
            spelled[byte] = 256 + len(spelled) - len(printable)
    return {chr(code): byte for byte, code in spelled.items()}


class HFTokenizer:
    """Wraps a loaded `transformers` tokenizer; `hf` stays reachable for its chat template."""

    def __init__(self, hf: Any) -> None:
        self.hf = hf
        self._added = hf.get_added_vocab()
        self._special = {i for i, token in hf.added_tokens_decoder.items() if token.special}

    @property
    def vocab_size(self) -> int:
        return len(self.hf)

    @cached_property
    def stop_id(self) -> int:
        """Looked up on first use: a tokenizer that only counts prompt tokens may have none."""
        return stop_token_id(self.hf)

    def encode(self, text: str) -> list[int]:
        return self.hf.encode(text, add_special_tokens=False, split_special_tokens=True)

    def encode_with_specials(self, text: str) -> list[int]:
        return self.hf.encode(text, add_special_tokens=False, split_special_tokens=False)

    def decode(self, ids: Sequence[int]) -> str:
        return self.hf.decode(list(ids), skip_special_tokens=False, clean_up_tokenization_spaces=False)

    def special_id(self, name: str) -> int:
        if name not in self._added:
            raise TokenizerError(
                f"{self.hf.name_or_path}: no added token named {name!r}; this target's template cannot use it"
            )
        return self._added[name]

    def is_special(self, token_id: int) -> bool:
        return token_id in self._special

    def token_bytes(self, token_id: int) -> bytes:
        if token_id in self.hf.added_tokens_decoder:
            return self.hf.added_tokens_decoder[token_id].content.encode()
        if type(self.hf.backend_tokenizer.decoder).__name__ != "ByteLevel":
            raise TokenizerError(
                f"{self.hf.name_or_path} is not a byte-level BPE tokenizer, so its ids have no raw bytes; "
                "rebuild ids from server token ids or text instead of logprob bytes"
            )
        alphabet = byte_level_alphabet()
        return bytes(alphabet[char] for char in self.hf.convert_ids_to_tokens(token_id))
