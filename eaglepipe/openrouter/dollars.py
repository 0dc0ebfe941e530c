"""How `budget.usd` is spread over the sets bought through OpenRouter (`budget.policy`).

- `share` (the default): each bought set may spend an equal share of budget.usd. A set its share stops is
  complete for now with what it bought (its summary says `partial: dollar_budget`), so a budget that ends
  still gives every set answers and the run a drafter. Raising budget.usd raises every share: the sets it
  stopped rerun, resume from their journals and buy the rest; the drafter retrains on the whole.
- `in_order`: the sets spend the run's budget as they come, in `datasets` order when run one after
  another. A set the budget stops fails, resumable; no drafter is trained until budget.usd is raised.

Either way the run-wide ledger keeps the whole run under budget.usd.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

POLICIES = ("share", "in_order")
# How a set ends when the dollars did not stop it: its answers do not depend on budget.usd.
ENDED_REGARDLESS_OF_DOLLARS = ("all_done", "token_budget")


@dataclass(frozen=True)
class DollarBudget:
    """What one bought set may spend: the run's budget, and under `share` its own part of it."""

    policy: str
    run_usd: float
    set_usd: float | None

    @property
    def partial_when_spent(self) -> bool:
        """A set stopped by its share is complete for now; under `in_order` it is unfinished."""
        return self.set_usd is not None

    def to_param(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_param(cls, param: dict[str, Any]) -> DollarBudget:
        return cls(policy=param["policy"], run_usd=float(param["run_usd"]), set_usd=param["set_usd"])


def planned_budget(config: dict[str, Any], bought_sets: list[str]) -> DollarBudget:
    """The budget every bought set runs under now (budget.usd split over `bought_sets` under `share`)."""
    budget = config["budget"]
    usd = float(budget["usd"])
    share = usd / len(bought_sets) if budget["policy"] == "share" and bought_sets else None
    return DollarBudget(policy=budget["policy"], run_usd=usd, set_usd=share)


def dollars_param(
    config: dict[str, Any], bought_sets: list[str], summary_path: Path, responses_path: Path
) -> dict[str, Any]:
    """The generate rule's `dollars` param. A finished set whose last run the dollars did not stop (every
    prompt answered, or its token budget reached) keeps the budget it ran under, so raising budget.usd
    reruns only the sets it stopped, not their answers' token, hidden-state and GPU work downstream."""
    if responses_path.is_file():
        ran_under = _ran_under(summary_path)
        if ran_under is not None:
            return ran_under
    return planned_budget(config, bought_sets).to_param()


def _ran_under(summary_path: Path) -> dict[str, Any] | None:
    try:
        summary = json.loads(summary_path.read_text())
    except (OSError, ValueError):
        return None
    ran_under = summary.get("dollar_budget") if isinstance(summary, dict) else None
    if summary.get("ended_because") in ENDED_REGARDLESS_OF_DOLLARS and isinstance(ran_under, dict):
        return ran_under
    return None
