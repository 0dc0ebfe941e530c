"""The time budgets of tests/budget.py, enforced on a small suite run by pytest in a subprocess, with budgets
of tenths of a second so that it runs in seconds."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

HERE = Path(__file__).resolve().parent

CONFTEST = f"""
import sys
sys.path.insert(0, {str(HERE)!r})
from budget import Budgets

def pytest_configure(config):
    config.addinivalue_line("markers", "budget(seconds, reason): as pyproject.toml declares it")
    config.pluginmanager.register(Budgets(), "budgets")
"""

SUITE = """
import time
import pytest
from budget import shared_budget

@pytest.fixture(scope="session")
def slow_dependency():
    time.sleep(0.6)

@pytest.fixture(scope="module")
@shared_budget(0.5, reason="its own setup is 0.2 s; what it uses is timed apart")
def shared(slow_dependency):
    time.sleep(0.2)

@pytest.fixture(scope="module")
@shared_budget(0.1, reason="too small on purpose")
def over_shared():
    time.sleep(0.3)

@pytest.mark.budget(0.5, reason="the shared fixtures it sets up first are not its own time")
def test_shared_time_is_not_the_tests(shared):
    time.sleep(0.1)

@pytest.mark.budget(0.2, reason="too small on purpose")
def test_over_its_budget():
    time.sleep(0.4)

@pytest.mark.budget(5, reason="the fixture is over, not the test")
def test_a_shared_fixture_over_its_budget(over_shared):
    pass

@pytest.mark.budget(0.2, reason="a failure stays the failure it is")
def test_a_failing_test_over_its_budget():
    time.sleep(0.4)
    assert False, "its own failure"
"""


def run_suite(tmp_path: Path, suite: str, stretch: float = 1.0) -> subprocess.CompletedProcess:
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "test_suite.py").write_text(textwrap.dedent(suite))
    command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rA", "test_suite.py"]
    env = {**os.environ, "TEST_BUDGET_STRETCH": str(stretch)}
    return subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=120, env=env)


def test_a_test_or_shared_fixture_over_its_budget_fails_naming_it(tmp_path: Path) -> None:
    run = run_suite(tmp_path, SUITE)
    out = run.stdout
    assert "PASSED test_suite.py::test_shared_time_is_not_the_tests" in out, out
    assert "FAILED test_suite.py::test_over_its_budget - the test took" in out, out
    assert "over its budget of 0.2 s" in out
    assert "FAILED test_suite.py::test_a_shared_fixture_over_its_budget" in out
    over = r"the shared fixture 'over_shared' took 0\.\d s to set up, over its budget of 0\.1 s"
    assert re.search(over, out)
    assert "FAILED test_suite.py::test_a_failing_test_over_its_budget - AssertionError" in out
    assert "3 failed, 1 passed in" in out


def test_a_loaded_machine_stretches_every_budget(tmp_path: Path) -> None:
    """Four times the load a machine of its own would have: what was over at 0.2 s and 0.1 s is within."""
    out = run_suite(tmp_path, SUITE, stretch=4).stdout
    assert "FAILED test_suite.py::test_a_failing_test_over_its_budget - AssertionError" in out, out
    assert "1 failed, 3 passed in" in out, out


def test_a_larger_budget_needs_a_reason(tmp_path: Path) -> None:
    run = run_suite(tmp_path, "import pytest\n\n@pytest.mark.budget(600)\ndef test_x():\n    pass\n")
    assert run.returncode != 0
    assert "budget marks without a reason in test_suite.py" in run.stderr, run.stderr
