"""Token ids to the text (and bytes) a provider sends back, with the model's own tokenizer."""

from __future__ import annotations

from typing import Any

from transformers.convert_slow_tokenizer import bytes_to_unicode

from eaglepipe.emulator.text_like import SWITCHES, EngineSwitch, engine_reply, kept_markers
from eaglepipe.messages import Message, Tool
from eaglepipe.target.chat_format import chat_format_for
from eaglepipe.target.hf_tokenizer import HFTokenizer


def decode(tokenizer: Any, ids: list[int]) -> str:
    """Special tokens stay in the text, as providers return them, so the ids can be rebuilt from it."""
    return tokenizer.decode(ids, skip_special_tokens=False)


class StreamDecoder:
    """Text deltas whose concatenation is `decode(all ids)`, at a cost per token that does not grow.

    Each step decodes only the last few ids (the window since the previous delta). A token can end
    inside a UTF-8 character; decoding then yields U+FFFD, so the delta waits for the character to end.
    """

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self.prefix_offset = 0
        self.read_offset = 0

    def push(self, token_id: int) -> str:
        self.ids.append(token_id)
        return self._delta(final=False)

    def flush(self) -> str:
        return self._delta(final=True)

    def _delta(self, final: bool) -> str:
        before = decode(self.tokenizer, self.ids[self.prefix_offset : self.read_offset])
        after = decode(self.tokenizer, self.ids[self.prefix_offset :])
        if len(after) <= len(before) or (after.endswith("\ufffd") and not final):
            return ""
        self.prefix_offset, self.read_offset = self.read_offset, len(self.ids)
        return after[len(before) :]


class TokenBytes:
    """The raw bytes of each token, as OpenAI-style logprobs report them (`bytes`).

    Byte-level BPE vocabularies spell bytes as printable characters; other vocabularies fall back to
    the UTF-8 of the decoded token.
    """

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.byte_of = {char: byte for byte, char in bytes_to_unicode().items()}
        self.special = set(tokenizer.all_special_ids) | set(tokenizer.get_added_vocab().values())

    def __call__(self, token_id: int) -> bytes:
        piece = self.tokenizer.convert_ids_to_tokens(token_id)
        if token_id in self.special or not all(char in self.byte_of for char in piece):
            return decode(self.tokenizer, [token_id]).encode("utf-8")
        return bytes(self.byte_of[char] for char in piece)


class EngineStream:
    """Stream deltas of an engine switch's text (`text_like`): special ids the engine skips never reach the
    decoder, and a stripping engine drops leading whitespace and holds trailing whitespace back until more
    text follows it (dropping it at the end)."""

    def __init__(self, decoder: StreamDecoder, skipped: frozenset[int], strip: bool) -> None:
        self.decoder = decoder
        self.skipped = skipped
        self.strip = strip
        self.pending = ""
        self.started = False

    def push(self, token_id: int) -> str:
        return "" if token_id in self.skipped else self._out(self.decoder.push(token_id))

    def flush(self) -> str:
        return self._out(self.decoder.flush())

    def _out(self, delta: str) -> str:
        if not self.strip:
            return delta
        text = self.pending + delta
        if not self.started:
            text = text.lstrip()
        body = text.rstrip()
        self.pending = text[len(body) :]
        self.started |= bool(body)
        return body


class TokenizerText:
    """The model's tokenizer as the app's text side (`backend.TokenText`); `text_like` makes the returned
    text what that engine would return (the default, `exact`, keeps special tokens in it)."""

    def __init__(self, tokenizer: Any, text_like: EngineSwitch = SWITCHES["exact"]) -> None:
        self.tokenizer = tokenizer
        self.token_bytes = TokenBytes(tokenizer)
        self.switch = text_like
        self.target = HFTokenizer(tokenizer)
        self.format = chat_format_for(self.target)
        kept = kept_markers(self.target)
        self.skipped = (
            frozenset(self.format.special_ids - kept) if text_like.skip_special_tokens else frozenset()
        )

    def prompt_ids(
        self, messages: list[Message], tools: list[Tool] | None, *, thinking: bool
    ) -> list[int]:
        # The model's template: it cannot reason, and declares tools its own way.
        return self.format.prompt_ids(messages, tools, thinking=False, tool_format="json")

    def decode(self, ids: list[int]) -> str:
        if self.switch.name == "exact":
            return decode(self.tokenizer, ids)
        return engine_reply(self.target, ids, self.switch, stopped=False, thinking=False).content

    def decoder(self) -> StreamDecoder | EngineStream:
        if self.switch.name == "exact":
            return StreamDecoder(self.tokenizer)
        return EngineStream(StreamDecoder(self.tokenizer), self.skipped, self.switch.whitespace == "strip")
