"""Finished prompts, one JSON line each, so a killed or failed run resumes without paying twice.

The journal is append-only: records of other fingerprints stay on disk (they were paid for) but are
never reused. Each line is written in one call, flushed and fsynced before the prompt counts as done.
A crash can leave at most one torn last line (no trailing newline): it is ignored on read and cut off
before the next append.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from types import TracebackType
from typing import Any

import anyio
import anyio.to_thread

from eaglepipe.openrouter.errors import OpenRouterError

log = logging.getLogger(__name__)

RECORDS_FILE = "records.jsonl"


def read_records(journal_dir: Path) -> list[dict[str, Any]]:
    """All complete records in write order; a torn last line is skipped, not an error."""
    path = Path(journal_dir) / RECORDS_FILE
    if not path.exists():
        return []
    complete, _torn = _split_torn_tail(path.read_bytes())
    records = []
    for number, line in enumerate(complete.splitlines(), start=1):
        try:
            records.append(json.loads(line))
        except ValueError:
            raise OpenRouterError(
                f"journal {path} line {number} is not JSON: fix or delete that line, then rerun"
            ) from None
    return records


def load_done(journal_dir: Path, fingerprint: str) -> dict[str, dict[str, Any]]:
    """Responses that may be reused: only the current fingerprint's, keyed by prompt id."""
    return {
        record["prompt_id"]: record
        for record in read_records(journal_dir)
        if record.get("fingerprint") == fingerprint
    }


def journaled_dollars(results_dir: Path) -> float:
    """What every set's journal, under every fingerprint, has been charged: the run's spend so far.

    Generation jobs run one at a time (`api=1`), so this read at a job's start plus the job's own spend is
    the run-wide total; it counts kept responses only (failed requests are not charged by OpenRouter).
    """
    return sum(
        (record.get("usage") or {}).get("cost") or 0.0
        for journal in sorted(Path(results_dir).glob(f"*/.journal/{RECORDS_FILE}"))
        for record in read_records(journal.parent)
    )


class Journal:
    """The append side; use as `async with Journal(dir) as journal`. Writes are serialised and shielded
    from cancellation, so Ctrl-C or a stopped task group never leaves a half-written record behind."""

    def __init__(self, journal_dir: Path) -> None:
        self.path = Path(journal_dir) / RECORDS_FILE
        self._lock = anyio.Lock()
        self._file: Any = None

    async def __aenter__(self) -> Journal:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        _cut_torn_tail(self.path)
        self._file = open(self.path, "ab")  # noqa: SIM115 - closed in __aexit__
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        with anyio.CancelScope(shield=True):
            async with self._lock:
                self._file.close()

    async def append(self, record: dict[str, Any]) -> None:
        """Returns once the record is on disk: only then may the prompt count as done."""
        line = (json.dumps(record, ensure_ascii=False, separators=(",", ":")) + "\n").encode("utf-8")
        with anyio.CancelScope(shield=True):
            async with self._lock:
                await anyio.to_thread.run_sync(self._write_durably, line)

    def _write_durably(self, line: bytes) -> None:
        self._file.write(line)
        self._file.flush()
        os.fsync(self._file.fileno())


def _split_torn_tail(data: bytes) -> tuple[bytes, bytes]:
    """(complete lines, torn remainder): every record ends in a newline, so anything after the last
    newline was cut short by a crash."""
    end = data.rfind(b"\n") + 1
    return data[:end], data[end:]


def _cut_torn_tail(path: Path) -> None:
    if not path.exists():
        return
    complete, torn = _split_torn_tail(path.read_bytes())
    if torn:
        log.warning("journal %s: dropping a torn last line (%d bytes) from a killed run", path, len(torn))
        with open(path, "r+b") as handle:
            handle.truncate(len(complete))
            handle.flush()
            os.fsync(handle.fileno())
