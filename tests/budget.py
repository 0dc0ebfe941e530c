"""Every test has a time budget the suite enforces, so the change that makes a test slow fails in that
change's CI run instead of pushing the whole run past CI's limit a few changes later, unnoticed.

A test's own time (its setup and call, without the shared fixtures it happened to set up first) must stay
under BUDGET_S, or under what its mark says with a reason: `@pytest.mark.budget(600, reason="...")` (on a
test, or on a module through `pytestmark`). A shared fixture (module or session scope) is set up once for
every test that uses it, and which test pays for that depends on the order and, under xdist, on the
worker; so its setup is timed apart (without the shared fixtures it uses in turn) and held to its own
budget: BUDGET_S, or what `@shared_budget(seconds, reason)` under its `@pytest.fixture` says. Either way
the test that was running fails, naming what was over and by how much.

Budgets are for a machine the suite has to itself, one worker per core. Where other work shares it (a
build beside CI, two test runs at once), every test is slower for reasons no change made, so a budget
stretches by the load over the cores (the last minute's load average, at least 1), or by
TEST_BUDGET_STRETCH where that is set (1: as strict as on an idle machine).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Generator
from typing import Any, TypeVar

import pytest

BUDGET_S = 120.0
ATTRIBUTE = "_eaglepipe_budget"
SHARED_S = pytest.StashKey[float]()  # the item's time in the shared fixtures it set up
OVER = pytest.StashKey[list[str]]()  # the shared fixtures it set up that went over their budgets
SETUP_S = pytest.StashKey[float]()

F = TypeVar("F", bound=Callable[..., Any])


def shared_budget(seconds: float, reason: str) -> Callable[[F], F]:
    """A shared fixture's setup budget (pytest takes no marks on fixtures): put it under `@pytest.fixture`."""

    def mark(function: F) -> F:
        setattr(function, ATTRIBUTE, (float(seconds), reason))
        return function

    return mark


def budget_of(item: pytest.Item) -> float:
    marker = item.get_closest_marker("budget")
    return float(marker.args[0]) if marker else BUDGET_S


def stretch() -> float:
    """How much slower than on a machine of its own the suite runs now: load over cores, at least 1."""
    if fixed := os.environ.get("TEST_BUDGET_STRETCH"):
        return float(fixed)
    return max(1.0, os.getloadavg()[0] / (os.cpu_count() or 1))


def over(seconds: float, budget: float) -> str | None:
    """The budget as it applies now, when `seconds` exceed it; else None."""
    factor = stretch()
    if seconds <= budget * factor:
        return None
    return f"{budget:g} s" + (f" (x{factor:.2f} for the machine's load)" if factor > 1 else "")


class Budgets:
    """The hooks: registered by tests/conftest.py."""

    def __init__(self) -> None:
        self.item: pytest.Item | None = None
        self.nested: list[float] = []  # per shared fixture being set up: its own shared fixtures' time

    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        unexplained = sorted(
            {
                item.nodeid.split("::")[0]
                for item in items
                if (marker := item.get_closest_marker("budget"))
                and not (len(marker.args) == 1 and marker.kwargs.get("reason"))
            }
        )
        if unexplained:
            raise pytest.UsageError(
                f"budget marks without a reason in {', '.join(unexplained)}: "
                '@pytest.mark.budget(seconds, reason="why this test needs them")'
            )

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item) -> Generator[None, object, object]:
        self.item = item
        item.stash[SHARED_S] = 0.0
        item.stash[OVER] = []
        try:
            return (yield)
        finally:
            self.item = None

    @pytest.hookimpl(wrapper=True)
    def pytest_fixture_setup(self, fixturedef: pytest.FixtureDef) -> Generator[None, object, object]:
        if fixturedef.scope == "function":
            return (yield)
        started = time.monotonic()
        self.nested.append(0.0)  # the shared fixtures it requests are set up inside this call
        try:
            return (yield)
        finally:
            spent = time.monotonic() - started
            own = spent - self.nested.pop()
            if self.nested:
                self.nested[-1] += spent
            elif self.item is not None:
                self.item.stash[SHARED_S] += spent
            seconds, _ = getattr(fixturedef.func, ATTRIBUTE, (BUDGET_S, None))
            if (limit := over(own, seconds)) and self.item is not None:
                self.item.stash[OVER].append(
                    f"the shared fixture '{fixturedef.argname}' took {own:.1f} s to set up, over its budget "
                    f"of {limit} (tests/budget.py: make it faster, or raise its @shared_budget and say why)"
                )

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(
        self, item: pytest.Item, call: pytest.CallInfo[None]
    ) -> Generator[None, pytest.TestReport, pytest.TestReport]:
        report = yield
        if report.when == "setup":
            item.stash[SETUP_S] = call.duration
        elif report.when == "call" and report.passed:
            own = item.stash[SETUP_S] + call.duration - item.stash[SHARED_S]
            problems = list(item.stash[OVER])
            if limit := over(own, budget_of(item)):
                problems.append(
                    f"the test took {own:.1f} s (setup and call, shared fixtures apart), over its budget of "
                    f"{limit} (tests/budget.py: make it faster, or mark a larger budget and say why)"
                )
            if problems:
                report.outcome = "failed"
                report.longrepr = "\n".join(problems)
        return report
