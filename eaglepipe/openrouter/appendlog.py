"""Append-only JSON-lines files that are on disk before `append` returns: the journal and the ledger.

Appends waiting together are written by one write + fsync (group commit), so 2000 requests in flight
cost a few fsyncs per second rather than one each; a line whose content is durable elsewhere is written
behind (`append_behind`), without an fsync of its own. A shared log (the run-wide ledger) takes an
exclusive `flock` around each write, so generation jobs running at once never interleave bytes. A crash
can leave at most one torn last line (no trailing newline): readers skip it and the next writer cuts it
off.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import logging
import os
import queue
import threading
from collections.abc import Mapping
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


class AppendLog:
    """Use as `async with AppendLog(path) as log: await log.append(record)`.

    One writer thread per log does the writes and fsyncs, so the event loop never waits on the disk and
    a hand-off costs a queue put and one wake-up (a hand-off to anyio's worker threads measured half again
    as much). A line is handed over before `append` first waits: a cancelled caller stops waiting, the
    line is still written whole, in order, and on disk when the log closes."""

    def __init__(self, path: Path, *, shared: bool = False) -> None:
        self.path = Path(path)
        self.shared = shared
        self._file: Any = None
        self._queue: queue.SimpleQueue[tuple[bytes, asyncio.Future[None] | None] | None] = queue.SimpleQueue()
        self._writer: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    async def __aenter__(self) -> AppendLog:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(self.path, "ab")  # noqa: SIM115 - closed in __aexit__
        with self._locked():
            self._cut_torn_tail()
        self._loop = asyncio.get_running_loop()
        self._writer = threading.Thread(
            target=self._write_forever, name=f"append {self.path.name}", daemon=True
        )
        self._writer.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        """Every line handed over is on disk before the file closes."""
        assert self._writer is not None
        self._queue.put(None)
        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(self._writer.join)
        self._file.close()

    async def append(self, record: Mapping[str, Any]) -> None:
        """Returns once the record is on disk: only then may what it records count as done."""
        await self._written(_line(record))

    def append_behind(self, record: Mapping[str, Any]) -> None:
        """Written in order after what was handed over before, without waiting, and fsynced with the next
        `append` (or the close): for a line whose content is already durable elsewhere (a kept answer's
        bill, which the next start rebuilds from the journal), so a kill loses nothing."""
        self._queue.put((_line(record), None))

    async def flush(self) -> None:
        """Until every line handed over before is on disk."""
        await self._written(b"")

    async def _written(self, line: bytes) -> None:
        assert self._loop is not None
        written = self._loop.create_future()
        self._queue.put((line, written))
        await written

    def _write_forever(self) -> None:
        """Writes what waits in the queue in one write (group commit), fsynced when any of it waits for
        that; a write error fails the waiting appends and is logged for lines nobody waits on. The close's
        `None` is the last item ever queued."""
        loop = self._loop
        assert loop is not None  # set in __aenter__, before this thread starts
        unsynced = closing = False
        while not closing:
            batch = [self._queue.get()]
            with contextlib.suppress(queue.Empty):
                while True:
                    batch.append(self._queue.get_nowait())
            closing = batch[-1] is None
            lines = [item for item in batch if item is not None]
            waiting = [written for _, written in lines if written is not None]
            error = None
            try:
                if lines:
                    self._write(b"".join(line for line, _ in lines))
                    unsynced = True
                if unsynced and (waiting or closing):
                    os.fsync(self._file.fileno())
                    unsynced = False
            except OSError as failure:
                error = failure
                log.error("cannot write %s (%s)", self.path, failure.strerror)
            if waiting:
                loop.call_soon_threadsafe(self._settle, waiting, error)

    def _settle(self, waiting: list[asyncio.Future[None]], error: OSError | None) -> None:
        for written in waiting:
            if written.done():  # its caller was cancelled
                continue
            if error is None:
                written.set_result(None)
            else:
                written.set_exception(
                    OpenRouterError(
                        f"cannot write {self.path} ({error.strerror}): free disk space or fix permissions, "
                        "then rerun"
                    )
                )

    def _write(self, data: bytes) -> None:
        with self._locked():
            self._file.write(data)
            self._file.flush()

    def _locked(self) -> _FileLock:
        return _FileLock(self._file.fileno() if self.shared else None)

    def _cut_torn_tail(self) -> None:
        complete, torn = split_torn_tail(self.path.read_bytes())
        if torn:
            log.warning("%s: dropping a torn last line (%d bytes) from a killed run", self.path, len(torn))
            os.truncate(self.path, len(complete))


def _line(record: Mapping[str, Any]) -> bytes:
    return (json.dumps(record, ensure_ascii=False, separators=(",", ":")) + "\n").encode("utf-8")


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
