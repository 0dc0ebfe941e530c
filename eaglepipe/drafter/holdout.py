"""Which prompts the drafter never trains on, and their prompt ids for the evaluation.

The held-out set is the first `per_dataset` prompts of each set's row order (rows follow the seeded
prompt order, so adding prompts to a set rarely changes it) plus any ids the config names.
"""

from __future__ import annotations

import json
from pathlib import Path

from eaglepipe.drafter import DrafterError
from eaglepipe.tokens.token_file import read_token_rows, read_token_stats


def select_holdout(token_stats: list[Path], *, per_dataset: int, explicit: list[str]) -> list[str]:
    chosen: list[str] = []
    for path in token_stats:
        chosen += read_token_stats(Path(path))["prompt_ids"][:per_dataset]
    chosen += [pid for pid in explicit if pid not in chosen]
    if not chosen:
        raise DrafterError(
            "no prompt is held out for the evaluation: set eval.holdout_per_dataset >= 1 or eval.holdout_ids"
        )
    return chosen


def holdout_prompts(
    datasets: list[str], token_files: list[Path], token_stats: list[Path], holdout_ids: list[str]
) -> list[tuple[str, str, list[int]]]:
    """(set, prompt id, rendered prompt ids) of every held-out prompt that has a tokenized sample;
    `datasets`, `token_files` and `token_stats` go set by set."""
    wanted = set(holdout_ids)
    found: list[tuple[str, str, list[int]]] = []
    for dataset, tensors_path, stats_path in zip(datasets, token_files, token_stats, strict=True):
        rows = read_token_rows(tensors_path, stats_path)
        for row, pid in enumerate(rows.prompt_ids):
            if pid in wanted:
                found.append((dataset, pid, rows.prompt(row).tolist()))
    return found


def training_holdout_prompts(
    train_report: Path, datasets: list[str], token_files: list[Path], token_stats: list[Path]
) -> list[tuple[str, str, list[int]]]:
    """`holdout_prompts` for the ids a training held out, as its `train.json` records them."""
    holdout_ids = json.loads(Path(train_report).read_text())["holdout_ids"]
    return holdout_prompts(datasets, token_files, token_stats, holdout_ids)
