"""The emulator's test-only modes (synthetic answers, the Kimi corpus, injected faults) over the package's
server (eaglepipe/emulator), and `running_emulator` to start it as a child process."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

from eaglepipe.emulator.runner import running_server

TESTS = Path(__file__).resolve().parent.parent.parent


@contextlib.contextmanager
def running_emulator(
    model_dir: Path | None,
    *,
    extra_args: Sequence[str] = (),
    log_path: Path | None = None,
    startup_timeout_s: float = 120,
) -> Iterator[str]:
    """Yield the base URL (`http://127.0.0.1:PORT/api/v1`) of `python -m support.emulator` serving
    `model_dir`, or synthetic answers when it is None (`extra_args` then carry the synthetic options)."""
    command = [
        sys.executable,
        "-m",
        "support.emulator",
        *(["--synthetic"] if model_dir is None else ["--model-dir", str(model_dir)]),
        "--host",
        "127.0.0.1",
        "--port",
        "0",
        *extra_args,
    ]
    with running_server(
        command, "emulator", log_path=log_path, startup_timeout_s=startup_timeout_s, env=import_path()
    ) as url:
        yield url


def import_path() -> dict[str, str]:
    """The environment that lets a child process import `support` (tests/ first on PYTHONPATH)."""
    return {"PYTHONPATH": os.pathsep.join([str(TESTS), *filter(None, [os.environ.get("PYTHONPATH")])])}
