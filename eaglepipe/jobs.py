"""What every Snakemake job shares: logging into its `log:` file, a thread cap, one-line errors and stops."""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from eaglepipe.errors import EaglepipeError
from eaglepipe.processes import JobStopped

# The shell's status for a command ended by Ctrl-C (128 + SIGINT).
INTERRUPTED_STATUS = 130


@contextmanager
def snakemake_job(smk: Any) -> Iterator[logging.Logger]:
    """Run a job body so that a user-facing error (`EaglepipeError`) ends it with its one actionable line;
    anything else is a bug and keeps its traceback."""
    log_path = Path(smk.log[0]) if smk.log else None
    handlers: list[logging.Handler] = [logging.StreamHandler(sys.stderr)]
    if log_path:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        handlers.append(logging.FileHandler(log_path, mode="w"))
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", handlers=handlers, force=True
    )
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per request drowns the job's own log
    _cap_threads(getattr(smk, "threads", 1))
    logger = logging.getLogger(f"eaglepipe.job.{smk.rule}")
    try:
        yield logger
    except KeyboardInterrupt as stop:
        # Ctrl-C is a request, not a failure of ours: one line saying what is kept and how to go on.
        kept = f"{stop}, " if isinstance(stop, JobStopped) else ""
        logger.warning("stopped: %srerun the same command to resume", kept)
        sys.exit(INTERRUPTED_STATUS)
    except EaglepipeError as error:
        logger.error("%s", error)
        sys.exit(1)


def _cap_threads(threads: int) -> None:
    """Parallel CPU jobs must not each grab every core. Only jobs whose stage already imported torch
    compute with it; the others (prompts, providers, the generation client) skip its start-up cost."""
    if "torch" not in sys.modules:
        return
    import torch

    from eaglepipe.target.load import flush_denormals

    torch.set_num_threads(max(1, int(threads)))
    flush_denormals()
