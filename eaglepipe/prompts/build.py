"""Turning loaded records into the prompt set file: ids, deduplication, a stable seeded order."""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Iterable, Sequence
from pathlib import Path

from eaglepipe.prompts.ids import prompt_id
from eaglepipe.prompts.records import PromptRecord, write_prompt_set
from eaglepipe.prompts.sources import SkippedRow, SourcedRecord, load_hf, load_jsonl
from eaglepipe.prompts.validate import PromptError

log = logging.getLogger(__name__)
STAT_KEYS = ("read", "kept", "duplicates_dropped", "stripped_trailing_assistant", "skipped_invalid")


def _order_key(seed: int, record_id: str) -> str:
    # Each prompt's place depends only on its own id, so adding prompts never reshuffles the others.
    return hashlib.sha256(f"{seed}:{record_id}".encode()).hexdigest()


def build_prompt_set(
    records: Iterable[SourcedRecord | SkippedRow], *, seed: int
) -> tuple[list[PromptRecord], dict]:
    """(records with ids, in seeded order, duplicates dropped; counts for the rule's log)."""
    stats = dict.fromkeys(STAT_KEYS, 0)
    first_use: dict[str, tuple[str, str]] = {}  # id -> (content hash, where it first appeared)
    seen_content: set[str] = set()
    kept: list[PromptRecord] = []
    for item in records:
        stats["read"] += 1
        if isinstance(item, SkippedRow):
            stats["skipped_invalid"] += 1
            continue
        stats["stripped_trailing_assistant"] += int(item.stripped_trailing_assistant)
        record = item.record
        content_hash = prompt_id(record["messages"], record.get("tools"))
        record_id = record.get("id", content_hash)
        first_hash, first_where = first_use.setdefault(record_id, (content_hash, item.where))
        if first_hash != content_hash:
            raise PromptError(
                f"prompt id {record_id!r} names two different prompts, at {first_where} and {item.where}; "
                "rename one of them or remove its id"
            )
        if content_hash in seen_content:
            stats["duplicates_dropped"] += 1
            continue
        seen_content.add(content_hash)
        prompt: PromptRecord = {"id": record_id, "messages": record["messages"]}
        if "tools" in record:
            prompt["tools"] = record["tools"]
        kept.append(prompt)
    kept.sort(key=lambda record: _order_key(seed, record["id"]))
    stats["kept"] = len(kept)
    return kept, stats


def load_source(source: dict, *, strip_trailing_assistant: bool) -> Sequence[SourcedRecord | SkippedRow]:
    """The records a set's `source` mapping describes (`type`: jsonl with `path`, or hf)."""
    kind = source.get("type") if isinstance(source, dict) else None
    if kind == "jsonl":
        unknown = sorted(set(source) - {"type", "path"})
        if unknown or not isinstance(source.get("path"), str):
            raise PromptError(
                f"jsonl source: needs only `path` (a string), got keys {', '.join(sorted(source))}"
            )
        return load_jsonl(Path(source["path"]), strip_trailing_assistant=strip_trailing_assistant)
    if kind == "hf":
        return load_hf(source, strip_trailing_assistant=strip_trailing_assistant)
    raise PromptError(
        f"prompt source type {kind!r} is not jsonl or hf; fix `source.type` for this set in the config"
    )


def strip_setting(source: dict, configured: bool) -> tuple[dict, bool]:
    """(the source without its own `strip_trailing_assistant`, whether to strip).

    Datasets end on the answer being imitated, so their trailing assistant turn goes by default."""
    source = dict(source)
    default = True if source.get("type") == "hf" else configured
    return source, bool(source.pop("strip_trailing_assistant", default))


def prepare_prompt_set(
    source: dict, *, name: str, seed: int, strip_trailing_assistant: bool
) -> tuple[list[PromptRecord], dict]:
    """(the set's records, the counts): everything building it does but the write."""
    loaded = load_source(source, strip_trailing_assistant=strip_trailing_assistant)
    records, stats = build_prompt_set(loaded, seed=seed)
    skipped = [item for item in loaded if isinstance(item, SkippedRow)]
    for row in skipped[:3]:
        log.warning("skipped %s", row.reason)
    if not records:
        first = f"; first: {skipped[0].reason}" if skipped else ""
        raise PromptError(f"{name}: the source gave no valid prompt ({len(skipped)} rows skipped{first})")
    return records, stats


def build_from_source(source: dict, out: Path, *, seed: int, strip_trailing_assistant: bool) -> dict:
    """Build and write one prompt set; returns the counts. A set with no valid prompt is an error."""
    records, stats = prepare_prompt_set(
        source, name=out.name, seed=seed, strip_trailing_assistant=strip_trailing_assistant
    )
    write_prompt_set(records, out)
    return stats


def check_edited_source(source: dict, built: Path, *, seed: int, strip_trailing_assistant: bool) -> None:
    """Raise PromptError if a JSONL source edited since `built` was written no longer builds.

    Called while Snakemake plans, before any job runs: a job that failed on it would first have deleted the
    built set, and rebuilding that set reruns everything downstream even when the source is put back as it
    was. Checked here, the set stays, and the same bytes back rerun nothing (Snakemake compares checksums).
    """
    if source.get("type") != "jsonl" or not built.exists():
        return
    path = Path(source["path"])
    if path.exists() and path.stat().st_mtime_ns <= built.stat().st_mtime_ns:
        return
    prepare_prompt_set(source, name=built.name, seed=seed, strip_trailing_assistant=strip_trailing_assistant)
