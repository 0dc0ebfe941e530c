"""Child servers that never outlive the job that started them (the emulator, a generation engine), and
the stop a job's own Ctrl-C handling reports."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
from pathlib import Path

_PR_SET_PDEATHSIG = 1
GRACE_S = 5.0


def die_with_parent() -> None:
    """In the child, before exec: the kernel sends SIGTERM when the parent dies (Linux only)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def stop_process_group(process: subprocess.Popen, grace_s: float = GRACE_S) -> None:
    """SIGTERM to the whole process group, SIGKILL if it is still there after `grace_s`."""
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(grace_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)  # anything the server itself started


def last_log_line(log_path: Path) -> str:
    """The log's last non-blank line: for a startup failure, the error that ended it."""
    try:
        lines = [line for line in log_path.read_text(errors="replace").splitlines() if line.strip()]
    except OSError:
        return "no log"
    return lines[-1].strip() if lines else "empty log"


class JobStopped(KeyboardInterrupt):
    """A Ctrl-C that the job caught, with what it kept (e.g. "37 answers kept") for its last line."""
