"""Append-only JSON-lines files that are on disk before `append` returns: the journal and the ledger.

Appends waiting together are written by one write + fsync (group commit), so 2000 requests in flight
cost a few fsyncs per second rather than one each. A shared log (the run-wide ledger) takes an exclusive
`flock` around each batch, so generation jobs running at once never interleave bytes. A crash can leave
at most one torn last line (no trailing newline): readers skip it and the next writer cuts it off.
"""

from __future__ import annotations

import fcntl
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


def read_lines(path: Path) -> list[dict[str, Any]]:
    """All complete records in write order; a torn last line is skipped, not an error."""
    records, _end = read_new_lines(path, 0)
    return records


def read_new_lines(path: Path, offset: int) -> tuple[list[dict[str, Any]], int]:
    """Records that start at or after byte `offset`, and the offset after the last complete one: a
    reader that keeps the offset sees each record once, however often it looks."""
    path = Path(path)
    try:
        with open(path, "rb") as handle:
            handle.seek(offset)
            data = handle.read()
    except FileNotFoundError:
        return [], offset
    complete, _torn = split_torn_tail(data)
    records = []
    for number, line in enumerate(complete.splitlines(), start=1):
        try:
            records.append(json.loads(line))
        except ValueError:
            where = f"line {number}" if offset == 0 else f"a line after byte {offset}"
            raise OpenRouterError(
                f"{path} {where} is not JSON: fix or delete that line, then rerun"
            ) from None
    return records, offset + len(complete)


def split_torn_tail(data: bytes) -> tuple[bytes, bytes]:
    """(complete lines, torn remainder): every record ends in a newline, so anything after the last
    newline was cut short by a crash (or is being written right now by another process)."""
    end = data.rfind(b"\n") + 1
    return data[:end], data[end:]


class _Batch:
    def __init__(self) -> None:
        self.lines: list[bytes] = []
        self.written = anyio.Event()
        self.error: OSError | None = None


class AppendLog:
    """Use as `async with AppendLog(path) as log: await log.append(record)`. Appends are shielded from
    cancellation: a stopped task group or Ctrl-C never leaves half a record behind."""

    def __init__(self, path: Path, *, shared: bool = False) -> None:
        self.path = Path(path)
        self.shared = shared
        self._file: Any = None
        self._pending = _Batch()
        self._committing = False

    async def __aenter__(self) -> AppendLog:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(self.path, "ab")  # noqa: SIM115 - closed in __aexit__
        with self._locked():
            self._cut_torn_tail()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._file.close()

    async def append(self, record: dict[str, Any]) -> None:
        """Returns once the record is on disk: only then may what it records count as done."""
        line = (json.dumps(record, ensure_ascii=False, separators=(",", ":")) + "\n").encode("utf-8")
        with anyio.CancelScope(shield=True):
            batch = self._pending
            batch.lines.append(line)
            if self._committing:
                await batch.written.wait()
            else:
                await self._commit()
            if batch.error is not None:
                raise OpenRouterError(
                    f"cannot write {self.path} ({batch.error.strerror}): free disk space or fix permissions, "
                    "then rerun"
                )

    async def _commit(self) -> None:
        """The first appender writes every batch that gathers while it waits on the disk."""
        self._committing = True
        try:
            while self._pending.lines:
                batch, self._pending = self._pending, _Batch()
                try:
                    await anyio.to_thread.run_sync(self._write_durably, b"".join(batch.lines))
                except OSError as error:
                    batch.error = error
                batch.written.set()
        finally:
            self._committing = False

    def _write_durably(self, data: bytes) -> None:
        with self._locked():
            self._file.write(data)
            self._file.flush()
            os.fsync(self._file.fileno())

    def _locked(self) -> _FileLock:
        return _FileLock(self._file.fileno() if self.shared else None)

    def _cut_torn_tail(self) -> None:
        complete, torn = split_torn_tail(self.path.read_bytes())
        if torn:
            log.warning("%s: dropping a torn last line (%d bytes) from a killed run", self.path, len(torn))
            os.truncate(self.path, len(complete))


class _FileLock:
    """An exclusive flock for the duration of a `with`; a no-op for a log only one process writes."""

    def __init__(self, fd: int | None) -> None:
        self.fd = fd

    def __enter__(self) -> None:
        if self.fd is not None:
            fcntl.flock(self.fd, fcntl.LOCK_EX)

    def __exit__(self, *exc: object) -> None:
        if self.fd is not None:
            fcntl.flock(self.fd, fcntl.LOCK_UN)
