"""A budget that ends still yields a drafter (budget.policy share): the tiny chain, answered by the emulator
serving the real small model, with a budget.usd that buys part of each set, ends with a drafter trained
on what was bought; raising budget.usd then buys only the prompts the journals lack and retrains."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
import yaml
from tiny_run import PROMPTS, RESULTS_ROOT, snakemake, tiny_config, write_prompts

from eaglepipe.openrouter.settings import max_request_usd

pytestmark = [
    pytest.mark.slow,
    pytest.mark.budget(300, reason="the tiny chain through Snakemake to a trained drafter, twice: ~110 s"),
]


def billed_prompts(results: Path) -> Counter[tuple[str, str]]:
    """(set, prompt id) of every billed request in the run's ledger."""
    lines = (results / ".ledger" / "ledger.jsonl").read_text().splitlines()
    entries = [json.loads(line) for line in lines]
    return Counter((e["set"], e["prompt_id"]) for e in entries if e["event"] == "billed")


def test_a_budget_that_ends_trains_on_what_it_bought_and_a_raise_buys_only_the_rest(
    tmp_path: Path, model_dir: Path
) -> None:
    (tmp_path / "sources").mkdir()
    for ds, texts in PROMPTS.items():
        write_prompts(tmp_path, ds, texts)
    config = tiny_config(model_dir)
    config["generation"]["concurrency"] = 1  # one answer at a time: the share stops it between answers
    config_path = tmp_path / "tiny.yaml"
    config_path.write_text(yaml.safe_dump(config))
    results = tmp_path / RESULTS_ROOT
    assert snakemake(tmp_path, "--until", "providers").returncode == 0
    # Each set's share holds about two answers at the dearest endpoint's worst case, of its four prompts.
    upper = max_request_usd(json.loads((results / "providers.json").read_text())["kept"], 12)
    config["budget"]["usd"] = 2.5 * upper * len(PROMPTS)
    config_path.write_text(yaml.safe_dump(config))

    plan = snakemake(tmp_path, "-n")
    in_short = plan.stderr.split("In short")[1].splitlines()[0]
    assert "2 sets x up to" in in_short and "then a drafter trained on them" in in_short, in_short
    first = snakemake(tmp_path, "--until", "train_drafter")  # evaluation and figures add nothing here
    assert first.returncode == 0, first.stderr[-4000:]
    for ds in PROMPTS:
        summary = json.loads((results / ds / "responses.summary.json").read_text())
        assert summary["ended_because"] == "dollar_budget" and summary["partial"] == "dollar_budget"
        assert 0 < summary["done"] < len(PROMPTS[ds])
        assert len((results / ds / "responses.jsonl").read_text().splitlines()) == summary["done"]
    trained = json.loads((results / "drafter" / "train.json").read_text())
    assert (results / "drafter" / "model.safetensors").is_file()
    first_samples = sum(
        len(json.loads((results / ds / "tokens.json").read_text())["prompt_ids"]) for ds in PROMPTS
    )
    assert 0 < first_samples < sum(map(len, PROMPTS.values()))
    drafter_time = (results / "drafter" / "model.safetensors").stat().st_mtime_ns

    config["budget"]["usd"] = 1.0
    config_path.write_text(yaml.safe_dump(config))
    second = snakemake(tmp_path, "--until", "train_drafter")
    assert second.returncode == 0, second.stderr[-4000:]
    for ds, texts in PROMPTS.items():
        summary = json.loads((results / ds / "responses.summary.json").read_text())
        assert summary["ended_because"] == "all_done" and summary["partial"] is None, second.stderr[-6000:]
        assert summary["resumed"] > 0  # what the first run bought was kept, not asked again
        assert len((results / ds / "responses.jsonl").read_text().splitlines()) == len(texts)
    assert max(billed_prompts(results).values()) == 1  # nothing bought twice
    assert sum(billed_prompts(results).values()) == sum(map(len, PROMPTS.values()))
    assert (results / "drafter" / "model.safetensors").stat().st_mtime_ns > drafter_time
    retrained = json.loads((results / "drafter" / "train.json").read_text())
    assert retrained != trained
