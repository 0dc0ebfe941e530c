"""One error tree: every public exception of the package is an `EaglepipeError` (a user-facing, one-line
error) unless listed below, and a Snakemake job ends on one with that line alone."""

from __future__ import annotations

import importlib
import inspect
import os
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

import eaglepipe
from eaglepipe.errors import EaglepipeError

REPO = Path(__file__).resolve().parent.parent
# Packages installed only in their own environments (.venv-vllm, .venv-sglang): a module that imports one
# at the top cannot be imported here. Any other ImportError is a bug and fails the test.
OPTIONAL = {"vllm", "sglang"}
# Public exceptions that are not the user's to fix, so a job must not hide their traceback.
NOT_USER_FACING = {
    # A Ctrl-C the job caught (a KeyboardInterrupt): jobs.py ends on it with its own "stopped" line.
    "eaglepipe.processes.JobStopped",
    # The emulator's server side: answers to its HTTP client, never raised in a job.
    "eaglepipe.emulator.errors.ApiError",  # an error answer in OpenRouter's body shape
    "eaglepipe.emulator.backend.GenerationFailed",  # becomes a server error for the client
    # One failed attempt, classified and retried or recorded by the generation client.
    "eaglepipe.openrouter.replies.RequestFailed",
}


def _optional(error: ImportError) -> bool:
    return (error.name or "").split(".")[0] in OPTIONAL


def _not_optional(name: str) -> None:
    """walk_packages' onerror: a package it cannot import."""
    error = sys.exc_info()[1]
    if not (isinstance(error, ImportError) and _optional(error)):
        raise error if error else ImportError(name)


def public_exceptions() -> dict[str, type[BaseException]]:
    """`module.Name` -> class, for every public exception class each module of the package defines."""
    found: dict[str, type[BaseException]] = {}
    for info in pkgutil.walk_packages(eaglepipe.__path__, "eaglepipe.", onerror=_not_optional):
        try:
            module = importlib.import_module(info.name)
        except ImportError as error:
            if _optional(error):
                continue
            raise
        for name, value in vars(module).items():
            if (
                inspect.isclass(value)
                and issubclass(value, BaseException)
                and value.__module__ == module.__name__
                and not name.startswith("_")
            ):
                found[f"{module.__name__}.{name}"] = value
    return found


def test_every_public_exception_is_an_eaglepipe_error_or_listed():
    found = public_exceptions()
    assert "eaglepipe.config.ConfigError" in found and "eaglepipe.errors.EaglepipeError" in found
    outside = sorted(name for name, cls in found.items() if not issubclass(cls, EaglepipeError))
    # Equal, not a subset: a listed class that is gone or became user-facing leaves the list too.
    assert outside == sorted(NOT_USER_FACING)


def test_value_errors_stay_value_errors():
    """Callers and tests catch these as ValueError: the new base is added, not swapped in."""
    from eaglepipe.config import ConfigError
    from eaglepipe.prompts.validate import PromptError
    from eaglepipe.target.chatml import ChatMLError
    from eaglepipe.tokens.rebuild import TokensError

    for cls in (ConfigError, PromptError, TokensError, ChatMLError):
        assert issubclass(cls, EaglepipeError) and issubclass(cls, ValueError)


JOB = """
import sys, types
from eaglepipe.jobs import snakemake_job

smk = types.SimpleNamespace(log=[sys.argv[1]], rule="demo", threads=1)
kind = sys.argv[2]
with snakemake_job(smk):
    if kind == "user":
        from eaglepipe.openrouter.errors import OpenRouterError
        raise OpenRouterError("keys/openrouter: the key file is empty; write your key into it")
    if kind == "config":
        from eaglepipe.config import ConfigError
        raise ConfigError("config.yaml: budget.usd must be a positive number")
    if kind == "internal":
        from eaglepipe.emulator.backend import GenerationFailed
        raise GenerationFailed("the emulator is shutting down")
    raise ValueError("a bug of ours")
"""


def run_job(tmp_path: Path, kind: str) -> tuple[subprocess.CompletedProcess, str]:
    log = tmp_path / "logs" / "demo.log"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    run = subprocess.run(
        [sys.executable, "-c", JOB, str(log), kind], capture_output=True, text=True, env=env, timeout=120
    )
    return run, log.read_text()


@pytest.mark.parametrize(
    ("kind", "message"),
    [
        ("user", "keys/openrouter: the key file is empty; write your key into it"),
        ("config", "config.yaml: budget.usd must be a positive number"),
    ],
)
def test_a_job_ends_on_an_eaglepipe_error_with_its_one_line(tmp_path, kind, message):
    run, log = run_job(tmp_path, kind)
    assert run.returncode == 1, run.stderr
    assert "Traceback" not in run.stderr
    assert [line.endswith(f"eaglepipe.job.demo: {message}") for line in run.stderr.splitlines()] == [True]
    assert [line.endswith(f"eaglepipe.job.demo: {message}") for line in log.splitlines()] == [True]


@pytest.mark.parametrize(
    ("kind", "raised"),
    [
        ("bug", "ValueError: a bug of ours"),
        # Defined in the package but no EaglepipeError: a bug too, whatever module it comes from.
        ("internal", "GenerationFailed: the emulator is shutting down"),
    ],
)
def test_any_other_error_keeps_its_traceback(tmp_path, kind, raised):
    run, log = run_job(tmp_path, kind)
    assert run.returncode == 1
    assert "Traceback (most recent call last)" in run.stderr
    assert run.stderr.rstrip().endswith(raised)
    assert log == ""
