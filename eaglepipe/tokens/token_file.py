"""The one reader of the token stage's output (`tokens.safetensors` with its `tokens.json`, docs/formats.md):
the hidden stage, the drafter's evaluation and the spend plan all read rows through it."""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path

from safetensors.torch import load_file
from torch import Tensor

from eaglepipe.errors import EaglepipeError


class TokenFileError(EaglepipeError, ValueError):
    """The two files of a set disagree: one line naming them and what to rerun."""


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
    tensors = load_file(str(tensors_path))
    prompt_ids = json.loads(Path(stats_path).read_text())["prompt_ids"]
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
