"""Kimi-K2.5's tokenizer, native: tiktoken over the model's own `tiktoken.model`, no remote code.

A transformers-converted fast tokenizer closes the gaps in the special table and shifts every special id
after 163588 (`<think>` becomes 163603), so the only trustworthy source is the rank file itself plus the
names in `tokenizer_config.json`; a full-size table is checked against the ids the model was trained on.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from collections.abc import Iterator, Sequence
from functools import cache
from pathlib import Path

import tiktoken

from eaglepipe.target.tokenizer import TokenizerError

# Moonshot's split pattern; `&&` is class intersection, which tiktoken's regex engine supports.
KIMI_PAT_STR = "|".join(
    [
        r"""[\p{Han}]+""",
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""\p{N}{1,3}""",
        r""" ?[^\s\p{L}\p{N}]+[\r\n]*""",
        r"""\s*[\r\n]+""",
        r"""\s+(?!\S)""",
        r"""\s+""",
    ]
)
# The official encoder cuts its input this way before BPE (long pieces made tiktoken panic); the cuts
# change the ids of long whitespace runs, so they are part of the tokenization.
WINDOW_CHARS = 400_000
MAX_RUN_CHARS = 25_000
NUM_SPECIAL = 256
KIMI_NUM_RANKS = 163_584
# Kimi-K2.5's named special ids; 163589, 163592, 163600 and 163608..163837 are unnamed reserved slots.
KIMI_SPECIAL_TOKENS: dict[int, str] = {
    163584: "[BOS]",
    163585: "[EOS]",
    163586: "<|im_end|>",
    163587: "<|im_user|>",
    163588: "<|im_assistant|>",
    163590: "<|start_header_id|>",
    163591: "<|end_header_id|>",
    163593: "[EOT]",
    163594: "<|im_system|>",
    163595: "<|tool_calls_section_begin|>",
    163596: "<|tool_calls_section_end|>",
    163597: "<|tool_call_begin|>",
    163598: "<|tool_call_argument_begin|>",
    163599: "<|tool_call_end|>",
    163601: "<|im_middle|>",
    163602: "<|media_begin|>",
    163603: "<|media_content|>",
    163604: "<|media_end|>",
    163605: "<|media_pad|>",
    163606: "<think>",
    163607: "</think>",
    163838: "[UNK]",
    163839: "[PAD]",
}
# The ids a shifted table gets wrong first; checked whenever the rank file has the real size.
CHECKED_AT_FULL_SIZE = ("<|im_end|>", "</think>")
STOP_TOKEN = "<|im_end|>"


def reserved_name(token_id: int) -> str:
    return f"<|reserved_token_{token_id}|>"


@cache
def _long_run(max_run: int) -> re.Pattern[str]:
    """Runs longer than `max_run` of whitespace or of non-whitespace (`\\s` is `str.isspace`), matched only at
    a run's start so the scan stays linear."""
    return re.compile(rf"(?<!\s)\s{{{max_run + 1},}}|(?<!\S)\S{{{max_run + 1},}}")


def split_long_runs(text: str, max_run: int = MAX_RUN_CHARS) -> list[str]:
    """`text` cut so no piece holds more than `max_run` consecutive whitespace or non-whitespace characters:
    each over-long run is cut every `max_run` characters from its start, as Moonshot's encoder does."""
    cuts = [
        match.start() + offset
        for match in _long_run(max_run).finditer(text)
        for offset in range(max_run, match.end() - match.start(), max_run)
    ]
    bounds = [0, *cuts, len(text)]
    return [text[start:end] for start, end in zip(bounds, bounds[1:], strict=False)]


def encoder_pieces(text: str) -> Iterator[str]:
    """The pieces the official encoder hands to tiktoken one by one: 400,000-character windows, then runs."""
    for start in range(0, len(text), WINDOW_CHARS):
        yield from split_long_runs(text[start : start + WINDOW_CHARS])


def read_ranks(path: Path) -> dict[bytes, int]:
    """`tiktoken.model`: one `<base64 token> <rank>` per line, ranks 0 .. n-1, each token and rank once."""
    if not path.is_file():
        raise TokenizerError(f"{path} is missing: copy tiktoken.model from the model's files")
    ranks: dict[bytes, int] = {}
    line_of_rank: dict[int, int] = {}
    with path.open("rb") as lines:
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            token, rank = _parse_rank_line(path, number, line)
            if rank in line_of_rank:
                raise TokenizerError(
                    f"{path} line {number}: rank {rank} already given on line {line_of_rank[rank]}; "
                    "the file is damaged: copy it again from the model's files"
                )
            if token in ranks:
                raise TokenizerError(
                    f"{path} line {number}: this token already has rank {ranks[token]} "
                    f"(line {line_of_rank[ranks[token]]}); the file is damaged: copy it again"
                )
            ranks[token] = rank
            line_of_rank[rank] = number
    _check_no_gap(path, line_of_rank)
    return ranks


def _parse_rank_line(path: Path, number: int, line: bytes) -> tuple[bytes, int]:
    fields = line.split()
    try:
        if len(fields) != 2:
            raise ValueError
        return base64.b64decode(fields[0], validate=True), int(fields[1])
    except (binascii.Error, ValueError):
        raise TokenizerError(
            f"{path} line {number}: expected '<base64 token> <rank>', got {line[:60]!r}; "
            "the file is damaged: copy it again from the model's files"
        ) from None


def _check_no_gap(path: Path, line_of_rank: dict[int, int]) -> None:
    if not line_of_rank:
        raise TokenizerError(f"{path} holds no ranks; copy tiktoken.model again from the model's files")
    if max(line_of_rank) == len(line_of_rank) - 1 and min(line_of_rank) == 0:
        return
    missing = next(rank for rank in range(len(line_of_rank) + 1) if rank not in line_of_rank)
    after = min(rank for rank in line_of_rank if rank > missing)
    raise TokenizerError(
        f"{path} line {line_of_rank[after]}: rank {after} given but rank {missing} is missing (ranks must "
        "run 0 .. n-1 without gaps); the file is damaged: copy it again from the model's files"
    )


def read_special_names(path: Path, num_ranks: int) -> dict[int, str]:
    """Names of the special ids from `added_tokens_decoder` (id -> {"content": name}); every id must lie in
    the 256 slots after the ranks."""
    if not path.is_file():
        raise TokenizerError(f"{path} is missing: it names the special tokens; copy it from the model files")
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as error:
        message = f"{path} line {error.lineno}: invalid JSON ({error.msg}); copy it again from the model"
        raise TokenizerError(message) from None
    decoder = config.get("added_tokens_decoder") if isinstance(config, dict) else None
    if not isinstance(decoder, dict):
        raise TokenizerError(f"{path}: no 'added_tokens_decoder' object; copy the model's original file")
    names: dict[int, str] = {}
    for key, entry in decoder.items():
        token_id, name = _parse_added_token(path, key, entry)
        if not num_ranks <= token_id < num_ranks + NUM_SPECIAL:
            raise TokenizerError(
                f"{path}: added_tokens_decoder[{key!r}] ({name!r}) is outside the special ids {num_ranks}.."
                f"{num_ranks + NUM_SPECIAL - 1} after tiktoken.model's {num_ranks} ranks; "
                "the two files do not belong together"
            )
        if name in names.values():
            raise TokenizerError(f"{path}: added_tokens_decoder names {name!r} twice; copy the original file")
        names[token_id] = name
    return names


def _parse_added_token(path: Path, key: str, entry: object) -> tuple[int, str]:
    content = entry.get("content") if isinstance(entry, dict) else None
    if not key.isdigit() or not isinstance(content, str):
        raise TokenizerError(
            f"{path}: added_tokens_decoder[{key!r}] must map an id to {{'content': name}}; copy the original"
        )
    return int(key), content


def special_table(num_ranks: int, names: dict[int, str]) -> dict[str, int]:
    """All 256 special ids by name, unnamed slots as `<|reserved_token_{id}|>`."""
    ids = range(num_ranks, num_ranks + NUM_SPECIAL)
    return {names.get(token_id, reserved_name(token_id)): token_id for token_id in ids}


def check_full_size_table(path: Path, num_ranks: int, table: dict[str, int]) -> None:
    """With the real rank count, the checked names must sit where Kimi-K2.5 was trained to see them."""
    if num_ranks != KIMI_NUM_RANKS:
        return
    for name in CHECKED_AT_FULL_SIZE:
        expected = next(i for i, n in KIMI_SPECIAL_TOKENS.items() if n == name)
        if table.get(name) != expected:
            raise TokenizerError(
                f"{path}: {name} has id {table.get(name)}, Kimi-K2.5 uses {expected}; the special table is "
                "shifted (a converted fast tokenizer's?): use the model's original tokenizer_config.json"
            )


class KimiTokenizer:
    """Kimi's BPE with its 256 special ids; `source` names the directory in errors."""

    def __init__(self, ranks: dict[bytes, int], names: dict[int, str], source: str) -> None:
        self.source = source
        self.num_ranks = len(ranks)
        self.specials = special_table(self.num_ranks, names)
        self.encoding = tiktoken.Encoding(
            name=f"kimi:{source}",
            pat_str=KIMI_PAT_STR,
            mergeable_ranks=ranks,
            special_tokens=self.specials,
            explicit_n_vocab=self.num_ranks + NUM_SPECIAL,
        )

    @classmethod
    def from_dir(cls, directory: str | Path) -> KimiTokenizer:
        directory = Path(directory)
        ranks = read_ranks(directory / "tiktoken.model")
        config = directory / "tokenizer_config.json"
        tokenizer = cls(ranks, read_special_names(config, len(ranks)), str(directory))
        check_full_size_table(config, len(ranks), tokenizer.specials)
        return tokenizer

    @property
    def vocab_size(self) -> int:
        return self.num_ranks + NUM_SPECIAL

    @property
    def stop_id(self) -> int:
        return self.special_id(STOP_TOKEN)

    def encode(self, text: str) -> list[int]:
        ids: list[int] = []
        for piece in encoder_pieces(text):
            ids += self.encoding.encode_ordinary(piece)
        return ids

    def encode_with_specials(self, text: str) -> list[int]:
        ids: list[int] = []
        for piece in encoder_pieces(text):
            ids += self.encoding.encode(piece, allowed_special="all", disallowed_special=())
        return ids

    def decode(self, ids: Sequence[int]) -> str:
        return self.encoding.decode(list(ids))

    def special_id(self, name: str) -> int:
        if name not in self.specials:
            raise TokenizerError(
                f"{self.source}: tokenizer_config.json's added_tokens_decoder names no special token {name!r}"
            )
        return self.specials[name]

    def is_special(self, token_id: int) -> bool:
        return self.num_ranks <= token_id < self.vocab_size

    def token_bytes(self, token_id: int) -> bytes:
        if not 0 <= token_id < self.vocab_size:
            raise TokenizerError(f"{self.source}: id {token_id} lies outside 0..{self.vocab_size - 1}")
        return self.encoding.decode_single_token_bytes(token_id)
