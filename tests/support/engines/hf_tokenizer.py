"""Kimi-K2.5's tokenizer as the serving engines load it: a transformers slow tokenizer over tiktoken.

vLLM and SGLang load Kimi's tokenizer with `trust_remote_code`, which gives Moonshot's class: a subclass
of transformers' `PreTrainedTokenizer` over tiktoken. Their detokenizers and parsers call that interface,
and the text they return depends on how it behaves, so this class keeps Moonshot's contract (read from its
published file, not copied) over eaglepipe's own tokenizer:

- every id has a token string: the byte-level (GPT-2) spelling of its bytes, a special id its name, and
  `get_vocab()` holds them all;
- `__init__` takes the config's `added_tokens_decoder` for the special names and passes on to transformers
  only bos, eos, unk, pad and eight chat markers as special tokens: those (and only those, unless
  transformers' loader adds more) are the tokenizer's added tokens, around which engines put spaces;
- `decode(ids)` without options is tiktoken's plain decode; with options, transformers' own.

Engines import it through the `tokenization_kimi.py` that `engine_model_dir` writes beside the files.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from transformers import PreTrainedTokenizer
from transformers.convert_slow_tokenizer import bytes_to_unicode

from eaglepipe.target.kimi_tokenizer import KimiTokenizer

# Moonshot's default `additional_special_tokens`: the chat markers its class registers as special.
CHAT_MARKERS = (
    "<|im_end|>",
    "<|im_user|>",
    "<|im_assistant|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "[EOT]",
    "<|im_system|>",
    "<|im_middle|>",
)


class TikTokenTokenizer(PreTrainedTokenizer):
    """Moonshot's interface (same class name, so `tokenizer_class` in the config matches)."""

    vocab_files_names = {"vocab_file": "tiktoken.model"}
    model_input_names = ["input_ids", "attention_mask"]

    def __init__(
        self,
        vocab_file: str,
        bos_token: Any = "[BOS]",
        eos_token: Any = "[EOS]",
        unk_token: Any = None,
        pad_token: Any = None,
        additional_special_tokens: list[str] | None = None,
        added_tokens_decoder: dict[int, Any] | None = None,  # taken, never passed on: Moonshot's contract
        **kwargs: Any,
    ) -> None:
        self.vocab_file = vocab_file
        # The special names come from the same tokenizer_config.json, read and checked by eaglepipe's loader.
        self.kimi = KimiTokenizer.from_dir(Path(vocab_file).parent)
        symbol = bytes_to_unicode()
        self.byte_of = {char: byte for byte, char in symbol.items()}
        self.token_of = [
            "".join(symbol[b] for b in self.kimi.token_bytes(i)) for i in range(self.kimi.vocab_size)
        ]
        self.id_of = {token: i for i, token in enumerate(self.token_of)}
        super().__init__(
            bos_token=bos_token,
            eos_token=eos_token,
            unk_token=unk_token,
            pad_token=pad_token,
            additional_special_tokens=list(CHAT_MARKERS)
            if additional_special_tokens is None
            else additional_special_tokens,
            **kwargs,
        )

    @property
    def vocab_size(self) -> int:
        return self.kimi.vocab_size

    def get_vocab(self) -> dict[str, int]:
        return dict(self.id_of)

    def encode(self, text: str, **kwargs: Any) -> list[int]:
        if kwargs:
            return super().encode(text, **kwargs)
        return self.kimi.encode_with_specials(text)

    def decode(self, token_ids: Any, *args: Any, **kwargs: Any) -> str | list[str]:
        if args or kwargs:
            return super().decode(token_ids, *args, **kwargs)
        return self.kimi.decode([token_ids] if isinstance(token_ids, int) else list(token_ids))

    def _tokenize(self, text: str, **kwargs: Any) -> list[str]:
        return [self.token_of[i] for i in self.kimi.encode_with_specials(text)]

    def _convert_token_to_id(self, token: str) -> int:
        return self.id_of.get(token, self.unk_token_id)

    def _convert_id_to_token(self, index: int) -> str:
        return self.token_of[index]

    def convert_tokens_to_string(self, tokens: list[str]) -> str:
        return bytes(self.byte_of[char] for char in "".join(tokens)).decode("utf-8", "replace")

    def save_vocabulary(self, save_directory: str, filename_prefix: str | None = None) -> tuple[str]:
        return (self.vocab_file,)
