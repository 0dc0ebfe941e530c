"""What reruns a bought set when the dollars change (eaglepipe/openrouter/dollars.py): the generate rule's
dollar_budget param, read back from the set's own files, and the plan that shows the sets a raise buys more
for."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from eaglepipe.config import validate_config
from eaglepipe.layout import RunLayout
from eaglepipe.openrouter.dollars import buys_more_on_rerun, dollar_budget_param, planned_budget
from eaglepipe.plan.estimate import spend_plan

REPO = Path(__file__).resolve().parent.parent
SETS = ["A", "B", "C", "D"]


def config(usd: float, policy: str = "share") -> dict:
    raw = {
        "datasets": SETS,
        "sources": {ds: {"type": "hf", "name": "org/data", "sample": 4} for ds in SETS},
        "target": {"name": "org/target", "path": "/nonexistent"},
        "api": {"model": "vendor/model"},
        "budget": {"usd": usd, "policy": policy},
    }
    return validate_config(raw, REPO / "schemas" / "config.schema.yaml")


def finished(
    tmp_path: Path,
    ended_because: str,
    key: object,
    ran_under: dict | None,
    partial: str | None = None,
    form: str = "now",
) -> None:
    """A finished set's files; `form` "older": a summary of before the budget had one name, which kept
    the param as `budget_key` beside `dollar_budget`."""
    (tmp_path / "responses.jsonl").write_text('{"prompt_id": "p0"}\n')
    summary = {"ended_because": ended_because, "partial": partial}
    summary["dollar_budget"] = ran_under if form == "older" else key
    if form == "older" and key is not None:
        summary["budget_key"] = key
    (tmp_path / "responses.summary.json").write_text(json.dumps(summary))


def key_of(tmp_path: Path, usd: float, policy: str = "share") -> object:
    summary, responses = tmp_path / "responses.summary.json", tmp_path / "responses.jsonl"
    return dollar_budget_param(config(usd, policy), SETS, summary, responses)


def test_a_set_not_answered_yet_runs_under_the_planned_budget(tmp_path):
    assert key_of(tmp_path, 100) == {"policy": "share", "run_usd": 100.0, "set_usd": 25.0}
    assert key_of(tmp_path, 100, "in_order") == {"policy": "in_order", "run_usd": 100.0, "set_usd": None}


@pytest.mark.parametrize("form", ["now", "older"])
@pytest.mark.parametrize("ended_because", ["all_done", "token_budget"])
def test_a_set_the_dollars_did_not_stop_keeps_its_key_whatever_the_budget(tmp_path, ended_because, form):
    first = planned_budget(config(100), SETS).to_param()
    finished(tmp_path, ended_because, first, first, form=form)
    assert key_of(tmp_path, 400) == key_of(tmp_path, 10) == key_of(tmp_path, 10, "in_order") == first


def test_a_finished_set_that_reruns_for_its_request_takes_the_planned_budget(tmp_path):
    first = planned_budget(config(100), SETS).to_param()
    finished(tmp_path, "token_budget", first, first)
    summary = json.loads((tmp_path / "responses.summary.json").read_text())
    summary.update(fingerprint="abc", output_token_budget=10)
    (tmp_path / "responses.summary.json").write_text(json.dumps(summary))
    paths = (tmp_path / "responses.summary.json", tmp_path / "responses.jsonl")
    same = {"fingerprint": "abc", "output_token_budget": 10}
    assert dollar_budget_param(config(400), SETS, *paths, same) == first
    for changed in ({**same, "fingerprint": "new"}, {**same, "output_token_budget": 20}):
        assert dollar_budget_param(config(400), SETS, *paths, changed)["set_usd"] == 100.0


def test_a_set_finished_before_budgets_were_recorded_keeps_the_param_it_ran_with(tmp_path):
    finished(tmp_path, "all_done", None, None)
    assert key_of(tmp_path, 100) == 100  # the old rule's usd_budget param: budget.usd itself


@pytest.mark.parametrize("form", ["now", "older"])
def test_a_set_its_share_stopped_reruns_only_when_its_share_grows(tmp_path, form):
    ran_under = planned_budget(config(100), SETS).to_param()
    finished(tmp_path, "dollar_budget", ran_under, ran_under, partial="dollar_budget", form=form)
    summary, responses = tmp_path / "responses.summary.json", tmp_path / "responses.jsonl"
    assert key_of(tmp_path, 100) == ran_under
    assert not buys_more_on_rerun(config(100), SETS, summary, responses)
    assert key_of(tmp_path, 60) == ran_under  # a smaller share cannot buy more: nothing reruns
    assert key_of(tmp_path, 200)["set_usd"] == 50.0
    assert buys_more_on_rerun(config(200), SETS, summary, responses)
    assert key_of(tmp_path, 100, "in_order")["policy"] == "in_order"


def test_the_plan_shows_a_stopped_set_a_raise_will_buy_more_for(tmp_path):
    layout = RunLayout(tmp_path / "results", tmp_path / "prompts")
    ran_under = planned_budget(config(100), SETS).to_param()
    (tmp_path / "results" / "A").mkdir(parents=True)
    finished(tmp_path / "results" / "A", "dollar_budget", ran_under, ran_under, partial="dollar_budget")

    def status(usd: float) -> str:
        plan = spend_plan(config(usd), ["A"], "fingerprint", layout=layout)
        return plan.sets[0].status

    assert status(100) == "extract"
    assert status(200) == "generate"
