"""The one tokenizer interface every stage uses, whatever the target (Kimi's tiktoken file or any HF model).

Stages need ids for ordinary text (a literal `<|im_end|>` in a user's text must stay text), the ids of
named special tokens, and the raw bytes of every id (logprobs report `bytes`, which map back to ranks).

The bottom of target/'s tokenizer stack: both implementations import it, so it imports neither. Picking
one for a directory is `load.load_target_tokenizer`; a tokenizer's chat format is
`chat_format.chat_format_for`.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

from eaglepipe.errors import EaglepipeError


class TokenizerError(EaglepipeError, ValueError):
    """A tokenizer file or lookup problem, in one line."""


class TargetTokenizer(Protocol):
    @property
    def vocab_size(self) -> int:
        """Ids run 0 .. vocab_size - 1 (special ids included)."""
        ...

    @property
    def stop_id(self) -> int:
        """The id that ends an assistant turn."""
        ...

    def encode(self, text: str) -> list[int]:
        """Ids of ordinary text: special-token strings inside it are encoded as text."""
        ...

    def encode_with_specials(self, text: str) -> list[int]:
        """Ids of a rendered string, as an engine tokenizes a prompt: special-token strings become ids."""
        ...

    def decode(self, ids: Sequence[int]) -> str:
        """Text of ids, special ids written as their names."""
        ...

    def special_id(self, name: str) -> int:
        """The id of a named special token; raises TokenizerError when the tokenizer has none."""
        ...

    def is_special(self, token_id: int) -> bool: ...

    def token_bytes(self, token_id: int) -> bytes:
        """The raw bytes of one id (a special id's name as UTF-8)."""
        ...


def has_kimi_tokenizer(target_dir: str | Path) -> bool:
    """Kimi-K2.5's layout: a `tiktoken.model` rank file rather than an HF tokenizer."""
    return (Path(target_dir) / "tiktoken.model").is_file()
