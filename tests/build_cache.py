"""What a fixture takes a minute or more to build (a whole run of the chain through Snakemake) is built once
into .test-cache/, keyed by the inputs that make it, and reused: by every xdist worker of the run (each
has its own session, so a session fixture alone would build it once per worker) and by the next `make
test` in the same checkout, until one of those inputs changes.

The key covers the pipeline's own files (every file git tracks or would track, but the tests, the docs,
the benchmarks and prose), the test files that drive the build, and what the caller adds (a model's
identity, settings). A build runs under a lock, in a scratch folder renamed into place when it is done,
so a reader never sees half of one; an older build of the same name is removed when a new one lands.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CACHE = REPO / ".test-cache"
NOT_THE_PIPELINE = ("tests/", "docs/", "bench/", ".ci/")


@contextmanager
def locked(path: Path) -> Iterator[None]:
    """One holder at a time, across processes (xdist workers, a pipeline running beside the tests)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def file_identity(path: Path) -> list[int]:
    """A large input's identity without reading it: rebuilt or replaced, it changes."""
    status = path.stat()
    return [status.st_size, status.st_mtime_ns]


def source_key(drivers: list[Path], **inputs: object) -> str:
    """A digest of the pipeline's files, the test files in `drivers` and `inputs` (JSON-able)."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=REPO,
        capture_output=True,
        check=True,
    ).stdout.decode()
    names = {
        name
        for name in listed.split("\0")
        if name and not name.startswith(NOT_THE_PIPELINE) and not name.endswith(".md")
    }
    names |= {str(path.relative_to(REPO)) for path in drivers}
    digest = hashlib.sha256(json.dumps(inputs, sort_keys=True).encode())
    for name in sorted(names):
        path = REPO / name
        if path.is_file():  # a tracked file deleted in the working tree is no input
            digest.update(name.encode() + b"\0" + hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()[:16]


def cached(name: str, key: str, build: Callable[[Path], object]) -> Path:
    """The folder `build` fills for `key`, built now only if no earlier build for `key` is there."""
    home = CACHE / name
    done = home / key
    with locked(CACHE / f".{name}.lock"):
        if not done.is_dir():
            for stale in home.glob("*"):
                shutil.rmtree(stale)
            scratch = home / f".building-{key}"
            scratch.mkdir(parents=True)
            build(scratch)
            os.replace(scratch, done)
    return done


def copy_of(built: Path, workdir: Path) -> Path:
    """A copy of a cached build for tests that change what they get. Its timestamps are kept, so Snakemake
    finds a copied run up to date."""
    shutil.copytree(built, workdir, symlinks=True)
    return workdir
