"""How `budget.usd` is spread over the sets bought through OpenRouter (`budget.policy`).

- `share` (the default): each bought set may spend an equal share of budget.usd. A set its share stops is
  complete for now with what it bought (its summary says `partial: dollar_budget`), so a budget that ends
  still gives every set answers and the run a drafter. Raising budget.usd raises every share: the sets it
  stopped rerun, resume from their journals and buy the rest; the drafter retrains on the whole.
- `in_order`: the sets spend the run's budget as they come, in `datasets` order when run one after
  another. A set the budget stops fails, resumable; no drafter is trained until budget.usd is raised.

Either way the run-wide ledger keeps the whole run under budget.usd.

The generate rule's `dollar_budget` param is the budget a set runs under, and a change of it reruns the set:
it is the planned budget, except where the budget cannot change the set's answers (it finished without the
dollars stopping it, or its share did not grow), which keep the key they last ran with, so raising
budget.usd reruns only the sets it can buy more for, not their downstream GPU work. A set that reruns for
another reason its summary shows (another request fingerprint or token budget) takes the planned budget.
One it cannot show (`--forcerun`, rebuilt prompts) runs under the kept one; a finished set's kept budget
bought it everything already, unless a budget.usd change came at the same time. The summary records the
budget as `dollar_budget` (summaries before it had one name also kept the param itself as `budget_key`, which
is read first).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypedDict

from eaglepipe.config_types import Config

POLICIES = ("share", "in_order")
# How a set ends when the dollars did not stop it: its answers do not depend on budget.usd.
ENDED_REGARDLESS_OF_DOLLARS = ("all_done", "token_budget")


class DollarBudgetParam(TypedDict):
    """A budget as the rule's param and the summary's `dollar_budget` hold it."""

    policy: str
    run_usd: float
    set_usd: float | None


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

    def to_param(self) -> DollarBudgetParam:
        return {"policy": self.policy, "run_usd": self.run_usd, "set_usd": self.set_usd}

    @classmethod
    def from_param(cls, param: Any) -> DollarBudget:
        """The rule's param: a dict, or budget.usd alone for a set finished before budgets were dicts."""
        if not isinstance(param, dict):
            return cls(policy="in_order", run_usd=float(param), set_usd=None)
        return cls(policy=param["policy"], run_usd=float(param["run_usd"]), set_usd=param["set_usd"])


def planned_budget(config: Config, bought_sets: list[str]) -> DollarBudget:
    """The budget every bought set runs under now (budget.usd split over `bought_sets` under `share`)."""
    budget = config["budget"]
    usd = float(budget["usd"])
    share = usd / len(bought_sets) if budget["policy"] == "share" and bought_sets else None
    return DollarBudget(policy=budget["policy"], run_usd=usd, set_usd=share)


def dollar_budget_param(
    config: Config,
    bought_sets: list[str],
    summary_path: Path,
    responses_path: Path,
    reruns_for: Mapping[str, object] | None = None,
) -> Any:
    """The generate rule's `dollar_budget` param (module docstring). `reruns_for`: the rule's other params
    that a summary records ({"fingerprint", "output_token_budget"}); a set whose summary differs reruns
    anyway, under the planned budget."""
    summary = _summary(summary_path) if responses_path.is_file() else None
    return _key(config, bought_sets, summary, reruns_for or {})


def _key(
    config: Config, bought_sets: list[str], summary: dict[str, Any] | None, reruns_for: Mapping[str, object]
) -> Any:
    planned = planned_budget(config, bought_sets)
    if summary is None or any(summary.get(key) != value for key, value in reruns_for.items()):
        return planned.to_param()
    ran_under = _ran_under(summary)
    if summary.get("ended_because") in ENDED_REGARDLESS_OF_DOLLARS:
        # A set finished before the budget was recorded ran with budget.usd itself as this param.
        return config["budget"]["usd"] if ran_under is None else ran_under
    if summary.get("partial") == "dollar_budget" and not _share_grew(summary.get("dollar_budget"), planned):
        return planned.to_param() if ran_under is None else ran_under
    return planned.to_param()


def _ran_under(summary: dict[str, Any]) -> Any:
    """The param a set last ran under: `budget_key` where an older summary kept it, else `dollar_budget`."""
    return summary["budget_key"] if "budget_key" in summary else summary.get("dollar_budget")


def buys_more_on_rerun(
    config: Config, bought_sets: list[str], summary_path: Path, responses_path: Path
) -> bool:
    """Whether a set its share stopped will rerun and buy more (budget.usd raised since)."""
    summary = _summary(summary_path) if responses_path.is_file() else None
    if summary is None or summary.get("partial") != "dollar_budget":
        return False
    return _key(config, bought_sets, summary, {}) != _ran_under(summary)


def _share_grew(ran_under: Any, planned: DollarBudget) -> bool:
    """Whether `planned` lets a set stopped under `ran_under` (its summary's dollar_budget) buy more."""
    if not isinstance(ran_under, dict) or ran_under.get("policy") != planned.policy:
        return True
    before = ran_under.get("set_usd")
    return planned.set_usd is None or before is None or planned.set_usd > float(before)


def _summary(summary_path: Path) -> dict[str, Any] | None:
    try:
        summary = json.loads(summary_path.read_text())
    except (OSError, ValueError):
        return None
    return summary if isinstance(summary, dict) else None
