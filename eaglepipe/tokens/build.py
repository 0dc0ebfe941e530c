"""The token stage: `tokens.safetensors` (ids, loss mask, per-sample method and flags) and `tokens.json`.

Every response becomes a sample (`rebuild`); the statistics cover all of them, before any is dropped, so
they say whether rebuilding works at all; then malformed samples are dropped, as are those whose length
contradicts the bill (`tokens.on_mismatch: drop`) or that have several readings (`tokens.on_ambiguous:
drop`). Answers with server ids are rebuilt a second time from their text alone, for the round-trip gate
(`round_trip`). docs/tokens.md explains the methods and the choice between readings.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import torch

from eaglepipe.prompts.records import read_prompt_set
from eaglepipe.responses import ResponseRecord, read_responses
from eaglepipe.target.chat_format import ChatFormat, chat_format_for
from eaglepipe.target.load import load_target_tokenizer
from eaglepipe.tokens.methods import AMBIGUITY_FLAGS, EXACT_METHODS, Flag, Method, flag_names
from eaglepipe.tokens.rebuild import Rebuilder, Rebuilt, RebuiltSample, TokensError, TokenSettings
from eaglepipe.tokens.round_trip import MISSES_LISTED, round_trip
from eaglepipe.tokens.token_file import (
    DroppedYield,
    PromptReport,
    TokenBilled,
    TokenStats,
    TokenYield,
    write_token_file,
)

log = logging.getLogger(__name__)

__all__ = ["TokensError", "build_tokens", "keep_reason", "summarize"]


def build_tokens(
    prompts_path: Path,
    responses_path: Path,
    target_dir: Path,
    tensors_path: Path,
    stats_path: Path,
    settings: TokenSettings,
) -> TokenStats:
    """Write `tokens.safetensors` and `tokens.json` for one prompt set; returns the statistics."""
    chat = chat_format_for(load_target_tokenizer(target_dir))
    prompts = {p["id"]: p for p in read_prompt_set(prompts_path)}
    records = read_responses(responses_path)
    rebuilt = Rebuilder(chat, settings).rebuild(prompts, records, str(responses_path))
    text_only = None
    if any(s.server_completion is not None for s in rebuilt.samples):
        text_only = Rebuilder(chat, settings, text_only=True).rebuild(prompts, records, str(responses_path))
    kept = [s for s in rebuilt.samples if keep_reason(s, settings) is None]
    for sample in rebuilt.samples:
        if (reason := keep_reason(sample, settings)) is not None:
            log.warning("prompt %s: dropped (%s)", sample.prompt_id, reason)
    if not kept:
        dropped = Counter(keep_reason(s, settings) for s in rebuilt.samples)
        raise TokensError(
            f"{responses_path}: no sample survived validation ({dict(dropped)}); see this job's log"
        )
    summary = summarize(chat, rebuilt, settings, len(prompts), records, text_only)
    tensors = sample_tensors(kept)
    write_token_file(tensors_path, tensors, stats_path, summary)
    return summary


def keep_reason(sample: RebuiltSample, settings: TokenSettings) -> str | None:
    """Why the sample is dropped, or None to keep it."""
    if sample.problem is not None:
        return sample.problem
    if sample.method is Method.REBUILT_OFF_BY_K and settings.on_mismatch == "drop":
        return "completion_count_mismatch"
    if sample.method is Method.REBUILT_SEGMENTATION_ONLY and settings.on_segmentation == "drop":
        return "segmentation_only"
    if sample.method is Method.REBUILT_AMBIGUOUS and settings.on_ambiguous == "drop":
        return "ambiguous"
    return None


def training_yield(
    samples: list[RebuiltSample], records: list[ResponseRecord], settings: TokenSettings
) -> TokenYield:
    """`tokens.json` `yield`: of the output tokens (and dollars) bought for this set's answers, how many
    have exact ids and how many are trained on, and what the rest was dropped for. An answer's tokens are
    its bill (`usage.completion_tokens`; without one, its rebuilt length); dollars its `usage.cost`.
    `samples` are in `records`' order (one each)."""
    bought = exact = trained = 0
    usd = trained_usd = 0.0
    dropped: dict[str, DroppedYield] = {}
    for sample, record in zip(samples, records, strict=True):
        tokens = sample.billed_completion
        tokens = len(sample.completion_ids) if tokens is None else tokens
        cost = float((record.get("usage") or {}).get("cost") or 0.0)
        bought += tokens
        usd += cost
        reason = keep_reason(sample, settings)
        if reason is None:
            trained += tokens
            trained_usd += cost
            exact += tokens if sample.method in EXACT_METHODS else 0
            continue
        cause = dropped.setdefault(reason, {"answers": 0, "tokens": 0, "usd": 0.0})
        cause["answers"] += 1
        cause["tokens"] += tokens
        cause["usd"] = round(cause["usd"] + cost, 6)
    return {
        "answers": len(samples),
        "bought_tokens": bought,
        "bought_usd": round(usd, 6),
        "exact_tokens": exact,
        "trained_tokens": trained,
        "trained_usd": round(trained_usd, 6),
        "trained_share": round(trained / bought, 6) if bought else None,
        "trained_tokens_by_method": {
            method.name.lower(): sum(
                s.billed_completion if s.billed_completion is not None else len(s.completion_ids)
                for s in samples
                if s.method is method and keep_reason(s, settings) is None
            )
            for method in Method
        },
        "dropped": dict(sorted(dropped.items())),
    }


def sample_tensors(samples: list[RebuiltSample]) -> dict[str, torch.Tensor]:
    """Flat rows `prompt + completion`; the loss mask is 1 exactly on the completion (stop token included)."""
    lengths = np.array([len(s.prompt_ids) + len(s.completion_ids) for s in samples], dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    input_ids = np.concatenate(
        [np.asarray(part, dtype=np.int32) for s in samples for part in (s.prompt_ids, s.completion_ids)]
    )
    prompt_len = np.array([len(s.prompt_ids) for s in samples], dtype=np.int64)
    loss_mask = np.ones(int(offsets[-1]), dtype=np.uint8)
    for start, length in zip(offsets[:-1], prompt_len, strict=True):
        loss_mask[start : start + length] = 0
    return {
        "input_ids": torch.from_numpy(input_ids),
        "loss_mask": torch.from_numpy(loss_mask),
        "offsets": torch.from_numpy(offsets),
        "prompt_len": torch.from_numpy(prompt_len),
        "method": torch.tensor([int(s.method) for s in samples], dtype=torch.uint8),
        "flags": torch.tensor([int(s.flags) for s in samples], dtype=torch.int32),
        "billed_diff": torch.tensor([s.billed_diff for s in samples], dtype=torch.int32),
    }


def summarize(
    chat: ChatFormat,
    rebuilt: Rebuilt,
    settings: TokenSettings,
    num_prompts: int,
    records: list[ResponseRecord],
    text_only: Rebuilt | None = None,
) -> TokenStats:
    """`tokens.json`: everything but `prompt_ids` counts all responses, before any drop; `records` are the
    responses `rebuilt` was made from (for `yield`); `text_only`, the same records rebuilt without their
    server ids (the round-trip gate)."""
    samples = rebuilt.samples
    kept = [s for s in samples if keep_reason(s, settings) is None]
    by_method = Counter(s.method.name.lower() for s in samples)
    billed = [s for s in samples if s.billed_completion is not None]
    return {
        "prompt_ids": [s.prompt_id for s in kept],
        "method_codes": {m.name.lower(): int(m) for m in Method},
        "flag_codes": {name.lower(): int(f) for name, f in Flag.__members__.items()},
        "counts": {
            "prompts": num_prompts,
            "responses": len(samples),
            "kept": len(kept),
            "by_method": dict(sorted(by_method.items())),
            "ambiguous_by_reason": _flag_counts(s for s in samples if s.method is Method.REBUILT_AMBIGUOUS),
            "flags": _flag_counts(samples, all_flags=True),
            "dropped": dict(Counter(r for s in samples if (r := keep_reason(s, settings)) is not None)),
            "prompt_count_mismatches": sum(bool(s.flags & Flag.PROMPT_COUNT_MISMATCH) for s in samples),
        },
        "shares": _shares(samples, by_method),
        "billed": _billed(billed, len(samples)),
        "prompt": _prompt_summary(samples, settings),
        "round_trip": round_trip(chat, samples, text_only.samples if text_only else None),
        "providers": {
            name: {**profile.summary(), **rebuilt.evidence[name].summary()}
            for name, profile in sorted(rebuilt.profiles.items())
        },
        "yield": training_yield(samples, records, settings),
    }


def _flag_counts(samples: Iterable[RebuiltSample], all_flags: bool = False) -> dict[str, int]:
    mask = ~0 if all_flags else int(AMBIGUITY_FLAGS)
    return dict(sorted(Counter(name for s in samples for name in flag_names(int(s.flags) & mask)).items()))


def _share(part: int, whole: int) -> float | None:
    return round(part / whole, 6) if whole else None


def _shares(samples: list[RebuiltSample], by_method: Counter[str]) -> dict[str, float | None]:
    """Shares of all responses: `exact` are ids the server gave; `billed_count_matched`, those whose ids
    have exactly the billed length, however obtained."""
    total = len(samples)
    shares = {"exact": _share(sum(s.method in EXACT_METHODS for s in samples), total)}
    shares |= {
        m.name.lower(): _share(by_method[m.name.lower()], total) for m in Method if m not in EXACT_METHODS
    }
    with_bill = [s for s in samples if s.billed_completion is not None]
    # None, not 0%, where no answer came with a count to match (imported answers without usage).
    matched = sum(s.billed_diff == 0 for s in with_bill)
    shares["billed_count_matched"] = _share(matched, total) if with_bill else None
    return shares


def _histogram(values: Iterable[int]) -> dict[str, int]:
    return {str(k): v for k, v in sorted(Counter(values).items())}


def _bill(sample: RebuiltSample) -> tuple[int, int]:
    """(billed completion tokens, as-returned difference) of a sample with a completion bill (a sample has
    the difference exactly when it has the bill)."""
    if sample.billed_completion is None or sample.as_returned_diff is None:
        raise ValueError(f"sample {sample.prompt_id!r} has no completion bill")
    return sample.billed_completion, sample.as_returned_diff


def _billed(samples: list[RebuiltSample], total: int) -> TokenBilled:
    """Over `samples`, the ones with a completion bill."""
    bills = [_bill(s) for s in samples]
    billed = sum(count for count, _ in bills)
    rebuilt = billed + sum(s.billed_diff for s in samples)
    as_returned = billed + sum(diff for _, diff in bills)
    return {
        "samples_without_billed_count": total - len(samples),
        "rebuilt_completion_tokens": rebuilt,
        "billed_completion_tokens": billed,
        # Over all samples, before any drop: the figure that says whether rebuilding works at all.
        "relative_difference": (rebuilt - billed) / billed if billed else None,
        "rebuilt_minus_billed_histogram": _histogram(s.billed_diff for s in samples),
        # The text encoded as returned, no engine reading undone: what naive re-encoding would give.
        "as_returned_relative_difference": (as_returned - billed) / billed if billed else None,
        "as_returned_minus_billed_histogram": _histogram(diff for _, diff in bills),
    }


def _prompt_summary(samples: list[RebuiltSample], settings: TokenSettings) -> PromptReport:
    billed_prompts = [(len(s.prompt_ids), s.billed_prompt) for s in samples if s.billed_prompt is not None]
    with_tools = [s for s in samples if s.prompt_diffs]
    formats = sorted({f for s in with_tools for f in s.prompt_diffs})
    checked = [(s, s.server_prompt) for s in samples if s.server_prompt is not None]
    mismatched = [(s, found) for s, found in checked if found.first_difference is not None]
    return {
        "count_mismatches": sum(bool(s.flags & Flag.PROMPT_COUNT_MISMATCH) for s in samples),
        # The server's own prompt ids against our rendering; where they differ, theirs are trained on.
        "server_ids": {
            "samples": len(checked),
            "matched": len(checked) - len(mismatched),
            "mismatched": len(mismatched),
            "mismatches": [
                {
                    "prompt_id": s.prompt_id,
                    "provider": s.provider,
                    "first_difference": found.first_difference,
                    "server_length": found.server_length,
                    "rendered_length": found.rendered_length,
                }
                for s, found in mismatched[:MISSES_LISTED]
            ],
        },
        "rebuilt_minus_billed_histogram": _histogram(length - billed for length, billed in billed_prompts),
        "tool_format": settings.tool_format,
        "samples_with_tools": len(with_tools),
        "used_other_tool_format": sum(bool(s.flags & Flag.PROMPT_OTHER_TOOL_FORMAT) for s in samples),
        "tool_formats": {
            f: {
                "matched": sum(s.prompt_diffs.get(f) == 0 for s in with_tools),
                "rendered_minus_billed_histogram": _histogram(
                    s.prompt_diffs[f] for s in with_tools if f in s.prompt_diffs
                ),
            }
            for f in formats
        },
    }
