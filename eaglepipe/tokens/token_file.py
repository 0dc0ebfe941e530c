"""The token stage's output (`tokens.safetensors` with its `tokens.json`, docs/formats.md): the statistics'
record and writer, and the one reader of each file: the hidden stage, the drafter, the spend plan and the
figures all read through it."""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict

from eaglepipe.errors import EaglepipeError
from eaglepipe.io import atomic_write, write_json

if TYPE_CHECKING:
    from torch import Tensor


class TokenFileError(EaglepipeError, ValueError):
    """The two files of a set disagree, or `tokens.json` is not the stage's: one line naming them and what
    to rerun."""


class TokenCounts(TypedDict):
    """`tokens.json` `counts`: of all responses, before any drop."""

    prompts: int
    responses: int
    kept: int
    by_method: dict[str, int]
    ambiguous_by_reason: dict[str, int]
    flags: dict[str, int]
    dropped: dict[str, int]
    prompt_count_mismatches: int


class TokenBilled(TypedDict):
    """`tokens.json` `billed`: the rebuilt completions against their bills."""

    samples_without_billed_count: int
    rebuilt_completion_tokens: int
    billed_completion_tokens: int
    relative_difference: float | None
    rebuilt_minus_billed_histogram: dict[str, int]
    as_returned_relative_difference: float | None
    as_returned_minus_billed_histogram: dict[str, int]


class DroppedYield(TypedDict):
    answers: int
    tokens: int
    usd: float


class TokenYield(TypedDict):
    """`tokens.json` `yield`: what of the bought output tokens (and dollars) reached training."""

    answers: int
    bought_tokens: int
    bought_usd: float
    exact_tokens: int
    trained_tokens: int
    trained_usd: float
    trained_share: float | None
    trained_tokens_by_method: dict[str, int]
    dropped: dict[str, DroppedYield]


class PromptMismatch(TypedDict):
    """A prompt whose server ids differ from our rendering."""

    prompt_id: str
    provider: str | None
    first_difference: int | None
    server_length: int
    rendered_length: int


class ServerPromptIds(TypedDict):
    samples: int
    matched: int
    mismatched: int
    mismatches: list[PromptMismatch]  # the first ones


class ToolFormatPrompts(TypedDict):
    """The prompts with tools, rendered with one tool-declaration format, against their bills."""

    matched: int
    rendered_minus_billed_histogram: dict[str, int]


class PromptReport(TypedDict):
    """`tokens.json` `prompt`: the rendered prompts against the bills and the server's own ids."""

    count_mismatches: int
    server_ids: ServerPromptIds
    rebuilt_minus_billed_histogram: dict[str, int]
    tool_format: str
    samples_with_tools: int
    used_other_tool_format: int
    tool_formats: dict[str, ToolFormatPrompts]


class RoundTripMiss(TypedDict):
    """An answer whose text-only rebuild differs from the server's ids."""

    prompt_id: str
    provider: str | None
    kind: str  # count_matched or off
    truth: str  # segmentation, dropped_special or structural
    first_difference: int
    server_length: int
    rebuilt_length: int
    rebuilt_method: str


class SegmentationOnly(TypedDict):
    """How well the `rebuilt_segmentation_only` label tells answers that differ only in their split."""

    labelled: int
    truly_segmentation: int
    precision: float | None
    dropped_special: int
    truly_segmentation_misses: int
    recall: float | None


class RoundTripReport(TypedDict):
    """`tokens.json` `round_trip`: the answers that came with server ids, rebuilt from their text alone."""

    samples: int
    exact: int
    count_matched: int
    off: int
    exact_share: float | None
    server_ids_rejected: int
    labelled_vs_truth: dict[str, int]
    segmentation_only: SegmentationOnly
    by_length: dict[str, dict[str, int]]
    misses: list[RoundTripMiss]


class EngineSummary(TypedDict):
    """How the token stage read one provider's replies, and what decided each field."""

    whitespace: list[str]
    whitespace_fallback: list[str]
    tool_ids: str
    arguments: str
    stop_billed: bool
    decided_by: dict[str, str]


class EvidenceSummary(TypedDict):
    samples: int
    pad_sites: int
    pad_refuted: int
    exact_id_samples: int


class ProviderReport(EngineSummary, EvidenceSummary):
    """`tokens.json` `providers[name]`."""


# `yield` is a keyword, hence the functional form. `prompt`, `round_trip` and `providers` are reports
# (docs/formats.md spells their keys); nothing reads them back but the figures' tables and the tests.
TokenStats = TypedDict(
    "TokenStats",
    {
        "prompt_ids": list[str],
        "method_codes": dict[str, int],
        "flag_codes": dict[str, int],
        "counts": TokenCounts,
        "shares": dict[str, float | None],
        "billed": TokenBilled,
        "prompt": PromptReport,
        "round_trip": RoundTripReport,
        "providers": dict[str, ProviderReport],
        "yield": TokenYield,
    },
)


def write_token_file(
    tensors_path: Path, tensors: dict[str, Tensor], stats_path: Path, stats: TokenStats
) -> None:
    """The token stage's two files (docs/formats.md), each atomically: `tokens.safetensors`, then
    `tokens.json`."""
    from safetensors.torch import save_file

    atomic_write(tensors_path, lambda tmp: save_file(tensors, str(tmp)))
    write_json(stats_path, stats)


def read_token_stats(path: Path) -> TokenStats:
    """`tokens.json`, checked only for what every reader needs (an object whose `prompt_ids` are strings);
    a file made by hand with `prompt_ids` alone reads, so readers of the other keys keep to `.get`."""
    try:
        stats = json.loads(Path(path).read_text())
    except ValueError:
        raise TokenFileError(f"{path} is not JSON: rerun the tokens rule") from None
    ids = stats.get("prompt_ids") if isinstance(stats, dict) else None
    if not isinstance(ids, list) or not all(isinstance(prompt_id, str) for prompt_id in ids):
        raise TokenFileError(f"{path} has no list of string `prompt_ids`: rerun the tokens rule")
    checked: TokenStats = stats
    return checked


@dataclass(frozen=True)
class TokenRows:
    """One set's samples, row r being `prompt_ids[r]`'s prompt followed by its answer."""

    prompt_ids: list[str]
    input_ids: Tensor
    loss_mask: Tensor
    offsets: list[int]
    prompt_len: list[int]

    def ids(self, row: int) -> Tensor:
        return self.input_ids[self.offsets[row] : self.offsets[row + 1]]

    def mask(self, row: int) -> Tensor:
        return self.loss_mask[self.offsets[row] : self.offsets[row + 1]]

    def prompt(self, row: int) -> Tensor:
        start = self.offsets[row]
        return self.input_ids[start : start + self.prompt_len[row]]


def read_token_rows(tensors_path: Path, stats_path: Path) -> TokenRows:
    from safetensors.torch import load_file  # torch only where rows are read: the plan and figures need none

    tensors = load_file(str(tensors_path))
    prompt_ids = read_token_stats(stats_path)["prompt_ids"]
    offsets = tensors["offsets"].tolist()
    if len(prompt_ids) != len(offsets) - 1:
        raise TokenFileError(
            f"{tensors_path}: {len(offsets) - 1} rows but {stats_path} lists {len(prompt_ids)} ids: "
            "rerun the tokens rule"
        )
    return TokenRows(
        prompt_ids=prompt_ids,
        input_ids=tensors["input_ids"],
        loss_mask=tensors["loss_mask"],
        offsets=offsets,
        prompt_len=tensors["prompt_len"].tolist(),
    )


def token_file_counts(tensors_path: Path) -> tuple[int, int]:
    """(tokens, samples) from the safetensors header alone: cheap enough for a parse-time estimate."""
    with open(tensors_path, "rb") as handle:
        (header_len,) = struct.unpack("<Q", handle.read(8))
        header = json.loads(handle.read(header_len))
    return int(header["input_ids"]["shape"][0]), int(header["offsets"]["shape"][0]) - 1
