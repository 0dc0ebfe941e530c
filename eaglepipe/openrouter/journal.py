"""Finished prompts of one set, one JSON line each, so a killed or failed run resumes without paying twice.

The journal is append-only: records of other fingerprints stay on disk (they were paid for) but are
never reused. A record is on disk (fsynced) before its prompt counts as done.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from eaglepipe.openrouter.appendlog import AppendLog, read_lines

RECORDS_FILE = "records.jsonl"


def read_records(journal_dir: Path) -> list[dict[str, Any]]:
    """All complete records in write order; a torn last line is skipped, not an error."""
    return read_lines(Path(journal_dir) / RECORDS_FILE)


def load_done(journal_dir: Path, fingerprint: str) -> dict[str, dict[str, Any]]:
    """Responses that may be reused: only the current fingerprint's, keyed by prompt id."""
    return reusable(read_records(journal_dir), fingerprint)


def reusable(records: list[dict[str, Any]], fingerprint: str) -> dict[str, dict[str, Any]]:
    return {record["prompt_id"]: record for record in records if record.get("fingerprint") == fingerprint}


def open_journal(journal_dir: Path) -> AppendLog:
    """The append side of one set's journal; only that set's generation job writes it."""
    return AppendLog(Path(journal_dir) / RECORDS_FILE)
