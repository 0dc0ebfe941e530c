"""The target's side of reconstruction: a tokenizer and the chat format it loads, once per stage.

Everything that differs between the families (Kimi-K2.5's `reasoning </think> content [tool section]
<|im_end|>`, an HF template's one text then `<|im_end|>`) goes through `eaglepipe.target.chat_format`.
"""

from __future__ import annotations

from eaglepipe.target.chat_format import ChatFormat, Layout
from eaglepipe.target.tokenizer import TargetTokenizer

__all__ = ["Layout", "Target"]


class Target:
    """A tokenizer plus its chat format; the format's members the token stage reads are named here."""

    def __init__(self, tokenizer: TargetTokenizer) -> None:
        self.tokenizer = tokenizer
        self.format: ChatFormat = tokenizer.chat_format()
        self.vocab_size = tokenizer.vocab_size
        self.encode = self.format.encode
        self.layout = self.format.layout
        self.special_ids = self.format.special_ids
        self.prompt_ids = self.format.prompt_ids
        self.special_positions = self.format.special_positions
        self.generation_prompt = self.format.generation_prompt
