"""Run the emulator as a child process for exactly as long as a `with` block.

Tests and the pipeline's local run both need a server that is really listening (a real socket, real
HTTP) and that never outlives them, even when they are interrupted or killed.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

from eaglepipe.emulator.errors import EmulatorError
from eaglepipe.processes import die_with_parent, last_log_line, stop_process_group


@contextlib.contextmanager
def running_emulator(
    model_dir: Path,
    *,
    extra_args: Sequence[str] = (),
    log_path: Path | None = None,
    startup_timeout_s: float = 120,
) -> Iterator[str]:
    """Yield the base URL (`http://127.0.0.1:PORT/api/v1`) of an emulator serving `model_dir`."""
    command = [
        sys.executable,
        "-m",
        "eaglepipe.emulator",
        "--model-dir",
        str(model_dir),
        "--host",
        "127.0.0.1",
        "--port",
        "0",
        *extra_args,
    ]
    with running_server(command, "emulator", log_path=log_path, startup_timeout_s=startup_timeout_s) as url:
        yield url


@contextlib.contextmanager
def running_server(
    command: Sequence[str],
    name: str,
    *,
    log_path: Path | None = None,
    startup_timeout_s: float = 120,
    env: Mapping[str, str] | None = None,
) -> Iterator[str]:
    """Yield the base URL of a loopback server started as `command` + `--port-file PATH` (it writes its
    bound port there, whole, once listening), stopped at the end of the block or when this process dies.
    `env` adds to the environment it inherits (the tests' server: its import path)."""
    with tempfile.TemporaryDirectory(prefix=f"eaglepipe-{name.replace(' ', '-')}-") as scratch:
        port_file = Path(scratch) / "port"
        log_path = log_path or Path(scratch) / f"{name.replace(' ', '-')}.log"
        with open(log_path, "ab") as log:
            process = subprocess.Popen(
                [*command, "--port-file", str(port_file)],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env={**os.environ, **(env or {})},
                preexec_fn=die_with_parent,
            )
        try:
            deadline = time.monotonic() + startup_timeout_s
            while not port_file.exists():
                if process.poll() is not None:
                    raise EmulatorError(
                        f"{name} exited with status {process.returncode} during startup "
                        f"({last_log_line(log_path)}): see {log_path}"
                    )
                if time.monotonic() > deadline:
                    raise EmulatorError(
                        f"{name} did not listen within {startup_timeout_s:g} s: see {log_path}"
                    )
                time.sleep(0.05)
            yield f"http://127.0.0.1:{int(port_file.read_text())}/api/v1"
        finally:
            stop_process_group(process)
