"""Finished prompts of one set, one JSON line each, so a killed or failed run resumes without paying twice.

The journal is append-only: records of other fingerprints stay on disk (they were paid for) but are
never reused. A record is on disk (fsynced) before its prompt counts as done. Beside it, `failed.jsonl`
holds the prompts that failed for good (the failure taxonomy's `prompt_permanent` rows), so a rerun does
not ask them again (a content filter bills each time) unless `generation.retry_failed` says so.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypedDict, TypeVar, cast

from eaglepipe.io import atomic_write
from eaglepipe.openrouter.appendlog import AppendLog, read_lines, read_new_lines
from eaglepipe.openrouter.errors import OpenRouterError
from eaglepipe.responses import ResponseRecord, record_problem

RECORDS_FILE = "records.jsonl"
FAILED_FILE = "failed.jsonl"
# What the spend plan needs of a journal, kept beside it: see `tally_done`.
TALLY_FILE = "tally.json"
TALLY_VERSION = 1

Keyed = TypeVar("Keyed", bound=Mapping[str, Any])

# A line of `failed.jsonl` (`class` is a keyword, hence the functional form): the failure taxonomy's class,
# the HTTP status where there was one.
FailureRecord = TypedDict(
    "FailureRecord", {"prompt_id": str, "fingerprint": str, "class": str, "status": int | None, "error": str}
)


class DoneUsage(TypedDict):
    prompt_tokens: int | None
    completion_tokens: int | None


class DoneTally(TypedDict):
    """What `tally_done` keeps of an answer: its usage's two counts."""

    usage: DoneUsage


def read_records(journal_dir: Path) -> list[ResponseRecord]:
    """All complete records in write order; a torn last line is skipped, not an error. Each is checked as
    responses.jsonl's are (`responses.record_problem`): the journal's lines become that file's."""
    path = Path(journal_dir) / RECORDS_FILE
    records = read_lines(path)
    for number, record in enumerate(records, start=1):
        problem = record_problem(record)
        if problem is not None:
            raise OpenRouterError(f"{path} line {number} {problem}: fix or delete that line, then rerun")
    return records  # type: ignore[return-value]  # checked above, line by line


def load_done(journal_dir: Path, fingerprint: str) -> dict[str, ResponseRecord]:
    """Responses that may be reused: only the current fingerprint's, keyed by prompt id."""
    return reusable(read_records(journal_dir), fingerprint)


def reusable(records: list[Keyed], fingerprint: str) -> dict[str, Keyed]:
    """Journal records (answers or permanent failures) of `fingerprint`, by prompt id."""
    return {record["prompt_id"]: record for record in records if record.get("fingerprint") == fingerprint}


def open_journal(journal_dir: Path) -> AppendLog:
    """The append side of one set's journal; only that set's generation job writes it."""
    return AppendLog(Path(journal_dir) / RECORDS_FILE)


def open_failures(journal_dir: Path) -> AppendLog:
    """The append side of the set's permanent failures: `{prompt_id, fingerprint, class, status, error}`."""
    return AppendLog(Path(journal_dir) / FAILED_FILE)


def failed_for_good(journal_dir: Path, fingerprint: str) -> dict[str, FailureRecord]:
    """The prompts earlier runs recorded as failed for good under `fingerprint`, by prompt id."""
    path = Path(journal_dir) / FAILED_FILE
    failures = read_lines(path)
    for number, failure in enumerate(failures, start=1):
        if not isinstance(failure, dict) or not isinstance(failure.get("prompt_id"), str):
            raise OpenRouterError(f"{path} line {number} has no string `prompt_id`: fix or delete that line")
    checked: list[FailureRecord] = failures  # type: ignore[assignment]  # checked above, line by line
    return reusable(checked, fingerprint)


class TallyFile(TypedDict):
    """tally.json: per fingerprint and prompt id, [prompt_tokens, completion_tokens] of the journal's first
    `offset` bytes; `identity` names the journal file they were read from."""

    version: int
    identity: list[Any]
    offset: int
    done: dict[str, dict[str, list[int | None]]]


def tally_done(journal_dir: Path, fingerprint: str) -> dict[str, DoneTally]:
    """Like `load_done`, but each record cut down to its usage (`{"usage": {prompt_tokens,
    completion_tokens}}`): all the spend plan needs. A Kimi-length journal holds hundreds of MB that every
    dry run would otherwise parse, so the usages are kept in `tally.json` beside it with the byte offset
    they cover, and each call reads only the lines appended since (the journal is append-only; a journal
    that was replaced or cut is tallied again from its start). The tally is a cache: losing it costs one
    full read, and a journal folder that cannot be written to is simply read."""
    journal_dir = Path(journal_dir)
    records_path = journal_dir / RECORDS_FILE
    try:
        identity = _journal_identity(records_path)
    except FileNotFoundError:
        return {}
    tally = _read_tally(journal_dir / TALLY_FILE)
    if (
        tally is None
        or tally.get("identity") != identity
        or tally.get("offset", 0) > records_path.stat().st_size
    ):
        tally = {"version": TALLY_VERSION, "identity": identity, "offset": 0, "done": {}}
    records, offset = read_new_lines(records_path, tally["offset"])
    for record in records:
        usage = record.get("usage") or {}
        by_prompt = tally["done"].setdefault(str(record.get("fingerprint")), {})
        by_prompt[record["prompt_id"]] = [usage.get("prompt_tokens"), usage.get("completion_tokens")]
    if offset != tally["offset"]:
        tally["offset"] = offset
        with contextlib.suppress(OSError):  # a read-only journal is still planned, read in full each time
            atomic_write(journal_dir / TALLY_FILE, lambda tmp: tmp.write_text(json.dumps(tally)))
    return {
        prompt_id: {"usage": {"prompt_tokens": prompt, "completion_tokens": completion}}
        for prompt_id, (prompt, completion) in tally["done"].get(fingerprint, {}).items()
    }


def _journal_identity(records_path: Path) -> list[Any]:
    """Which file the tally's offset belongs to: a recreated journal has another inode or first line."""
    stat = records_path.stat()
    with open(records_path, "rb") as handle:
        first_line = handle.readline()
    return [stat.st_dev, stat.st_ino, hashlib.sha256(first_line).hexdigest()[:16]]


def _read_tally(path: Path) -> TallyFile | None:
    try:
        tally = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not (isinstance(tally, dict) and tally.get("version") == TALLY_VERSION):
        return None
    return cast(TallyFile, tally)  # this version's file, as this module wrote it
