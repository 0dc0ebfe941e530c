"""File writes that a kill cannot tear: results are either the old file or the whole new one."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any


def atomic_write(path: Path, write: Callable[[Path], object]) -> None:
    """Call `write(tmp)` on a temporary sibling, fsync it, then rename it over `path` (what `write` returns,
    e.g. `Path.write_text`'s count, is ignored)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        write(tmp)
        with open(tmp, "rb") as handle:
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_json(path: Path, obj: Any) -> None:
    atomic_write(path, lambda tmp: tmp.write_text(json.dumps(obj, indent=1, ensure_ascii=False) + "\n"))


def file_sha256(path: Path) -> str:
    """Streamed, so hashing a multi-GB shard never holds it in memory."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def json_lines(path: Path, not_json: Callable[[int], Exception]) -> Iterator[tuple[int, Any]]:
    """(line number, parsed value) of each non-blank line of a JSONL file, read one line at a time; a line
    that is not JSON raises `not_json(number)`, the reader's own one-line error."""
    with open(path, encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                value = json.loads(line)
            except ValueError:
                raise not_json(number) from None
            yield number, value
