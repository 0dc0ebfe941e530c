"""Rebuild each sample's token ids: the rendered prompt, then the completion.

Completion ids come from the server when it returned them and they decode to the returned text (then
they are the truth, whatever the bill says), else from re-encoding the text; a re-encoded sample whose
length differs from the billed `completion_tokens` is dropped (or kept, per `tokens.on_mismatch`). Both
kinds are compared with the bill, and prompt lengths with the billed `prompt_tokens`, in `tokens.json`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from enum import IntEnum
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from eaglepipe.io import atomic_write, read_jsonl, write_json
from eaglepipe.target.chat import normalize_messages, render_prompt_ids, stop_token_id
from eaglepipe.target.load import load_tokenizer

log = logging.getLogger(__name__)


class TokensError(ValueError):
    """A token-stage input problem, in one line."""


class Method(IntEnum):
    """How a sample's completion ids were obtained (stored per sample in `method`)."""

    SERVER_IDS = 0
    RETOKENIZED_COUNT_MATCH = 1
    RETOKENIZED_COUNT_MISMATCH = 2


@dataclass
class Sample:
    prompt_id: str
    prompt_ids: list[int]
    completion_ids: list[int]
    method: Method
    billed_prompt: int | None
    billed_completion: int | None


@dataclass
class Stats:
    rows: list[str] = field(default_factory=list)
    by_method: dict[str, int] = field(default_factory=dict)
    dropped: dict[str, int] = field(default_factory=dict)
    completion_diffs: dict[str, int] = field(default_factory=dict)
    prompt_mismatches: int = 0
    rebuilt_completion_sum: int = 0
    billed_completion_sum: int = 0

    def count(self, bucket: dict[str, int], key: str) -> None:
        bucket[key] = bucket.get(key, 0) + 1


def completion_text(response: dict[str, Any], tokenizer: Any) -> str:
    """The answer as the target's template renders an assistant turn (tool calls as text for ChatML)."""
    turn = normalize_messages(
        tokenizer,
        [{"role": "assistant", "content": response.get("content"), "tool_calls": response.get("tool_calls")}],
        None,
    )[0]
    return turn["content"]


def rebuild_sample(prompt: dict[str, Any], record: dict[str, Any], tokenizer: Any, stop_id: int) -> Sample:
    response, usage = record["response"], record.get("usage") or {}
    if response.get("reasoning"):
        raise TokensError(
            f"prompt {prompt['id']}: the response carries reasoning, which this stage cannot tokenize yet; "
            "generate without reasoning (generation.reasoning: {enabled: false}) for this target"
        )
    prompt_ids = render_prompt_ids(tokenizer, prompt["messages"], prompt.get("tools"))
    truncated = response.get("finish_reason") == "length"
    text = completion_text(response, tokenizer)
    server_ids = response.get("token_ids")
    if server_ids is not None and tokenizer.decode(server_ids, skip_special_tokens=False) == text:
        ids, method = list(server_ids), Method.SERVER_IDS
    else:
        if server_ids is not None:
            log.warning("prompt %s: server ids do not decode to the returned text; re-encoding", prompt["id"])
        ids, method = tokenizer.encode(text, add_special_tokens=False), None
    if not truncated:
        ids.append(stop_id)
    billed = usage.get("completion_tokens")
    if method is None:
        method = Method.RETOKENIZED_COUNT_MATCH if billed == len(ids) else Method.RETOKENIZED_COUNT_MISMATCH
    return Sample(prompt["id"], prompt_ids, ids, method, usage.get("prompt_tokens"), billed)


def check_structure(sample: Sample, vocab_size: int, stop_id: int, truncated: bool) -> str | None:
    """The reason a sample is structurally wrong, or None."""
    if not sample.completion_ids:
        return "empty_completion"
    if any(not 0 <= t < vocab_size for t in sample.prompt_ids + sample.completion_ids):
        return "id_outside_vocabulary"
    if not truncated and sample.completion_ids[-1] != stop_id:
        return "missing_stop_token"
    if stop_id in sample.completion_ids[:-1]:
        return "stop_token_inside_completion"
    return None


def build_tokens(
    prompts_path: Path,
    responses_path: Path,
    target_dir: Path,
    tensors_path: Path,
    stats_path: Path,
    *,
    on_mismatch: str = "drop",
) -> dict[str, Any]:
    """Write `tokens.safetensors` and `tokens.json` for one prompt set; returns the statistics."""
    tokenizer = load_tokenizer(target_dir)
    stop_id = stop_token_id(tokenizer)
    vocab_size = len(tokenizer)
    prompts = {p["id"]: p for p in read_jsonl(prompts_path)}
    stats = Stats()
    input_ids: list[int] = []
    loss_mask: list[int] = []
    offsets, prompt_lens, methods = [0], [], []

    for record in read_jsonl(responses_path):
        prompt = prompts.get(record["prompt_id"])
        if prompt is None:
            raise TokensError(
                f"{responses_path}: prompt id {record['prompt_id']} is not in {prompts_path}; "
                "the responses are stale: rerun generation"
            )
        sample = rebuild_sample(prompt, record, tokenizer, stop_id)
        truncated = record["response"].get("finish_reason") == "length"
        if sample.billed_completion is not None:
            diff = len(sample.completion_ids) - sample.billed_completion
            stats.count(stats.completion_diffs, str(diff))
            stats.rebuilt_completion_sum += len(sample.completion_ids)
            stats.billed_completion_sum += sample.billed_completion
        if sample.billed_prompt is not None and sample.billed_prompt != len(sample.prompt_ids):
            stats.prompt_mismatches += 1
        stats.count(stats.by_method, sample.method.name.lower())

        reason = check_structure(sample, vocab_size, stop_id, truncated)
        if reason is None and sample.method is Method.RETOKENIZED_COUNT_MISMATCH and on_mismatch == "drop":
            reason = "completion_count_mismatch"
        if reason:
            log.warning("prompt %s: dropped (%s)", sample.prompt_id, reason)
            stats.count(stats.dropped, reason)
            continue
        stats.rows.append(sample.prompt_id)
        input_ids += sample.prompt_ids + sample.completion_ids
        loss_mask += [0] * len(sample.prompt_ids) + [1] * len(sample.completion_ids)
        offsets.append(len(input_ids))
        prompt_lens.append(len(sample.prompt_ids))
        methods.append(int(sample.method))

    if not stats.rows:
        raise TokensError(
            f"{responses_path}: no sample survived validation ({stats.dropped}); see this job's log"
        )
    tensors = {
        "input_ids": torch.tensor(input_ids, dtype=torch.int32),
        "loss_mask": torch.tensor(loss_mask, dtype=torch.uint8),
        "offsets": torch.tensor(offsets, dtype=torch.int64),
        "prompt_len": torch.tensor(prompt_lens, dtype=torch.int64),
        "method": torch.tensor(methods, dtype=torch.uint8),
    }
    summary = _summary(stats, len(prompts))
    atomic_write(tensors_path, lambda tmp: save_file(tensors, str(tmp)))
    write_json(stats_path, summary)
    return summary


def _summary(stats: Stats, num_prompts: int) -> dict[str, Any]:
    billed = stats.billed_completion_sum
    return {
        "prompt_ids": stats.rows,
        "method_codes": {m.name.lower(): int(m) for m in Method},
        "counts": {
            "prompts": num_prompts,
            "kept": len(stats.rows),
            "by_method": stats.by_method,
            "dropped": stats.dropped,
            "prompt_count_mismatches": stats.prompt_mismatches,
        },
        "billed": {
            "rebuilt_completion_tokens": stats.rebuilt_completion_sum,
            "billed_completion_tokens": billed,
            # Over all samples, before any drop: the figure that says whether rebuilding works at all.
            "relative_difference": (stats.rebuilt_completion_sum - billed) / billed if billed else None,
            "rebuilt_minus_billed_histogram": dict(
                sorted(stats.completion_diffs.items(), key=lambda kv: int(kv[0]))
            ),
        },
    }
