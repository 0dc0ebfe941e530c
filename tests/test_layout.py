"""The results layout has one owner: a file renamed in eaglepipe/layout.py moves the rules, the spend plan
and the generation stage's key check with it, with no other edit."""

from __future__ import annotations

import ast
import json
import os
import re
from pathlib import Path

import yaml
from tiny_run import PROMPTS, RESULTS_ROOT, snakemake, tiny_config, write_prompts

from eaglepipe.layout import RunLayout

# Imported first by every Python process started with this on PYTHONPATH, Snakemake's included.
RENAME_RESPONSES = """
from eaglepipe.layout import RunLayout, WILDCARD
RunLayout.responses = lambda self, ds=WILDCARD: self.set_dir(ds) / "answers.jsonl"
"""


def test_every_results_path_is_a_member_of_the_layout():
    layout = RunLayout.from_paths("results/demo/", "results/demo/prompts")
    assert str(layout.responses()) == "results/demo/{ds}/responses.jsonl"
    assert str(layout.hidden_done("B5")) == "results/demo/B5/hidden.done"
    assert str(layout.prompt_set("B5")) == "results/demo/prompts/B5.jsonl"
    assert str(layout.speculators_config) == "results/demo/drafter/speculators/config.json"


def test_a_renamed_file_moves_every_rule_and_the_spend_plan(tmp_path, model_dir):
    (tmp_path / "sources").mkdir()
    for ds, texts in PROMPTS.items():
        write_prompts(tmp_path, ds, texts)
    (tmp_path / "tiny.yaml").write_text(yaml.safe_dump(tiny_config(model_dir)))
    shim = tmp_path / "shim"
    shim.mkdir()
    (shim / "sitecustomize.py").write_text(RENAME_RESPONSES)
    # One set already answered, under the new name only: the plan must see it.
    answered = tmp_path / RESULTS_ROOT / "tiny-a" / "answers.jsonl"
    answered.parent.mkdir(parents=True)
    record = {"prompt_id": "p", "usage": {"prompt_tokens": 9, "completion_tokens": 5}}
    answered.write_text(json.dumps(record) + "\n")
    paths = [str(shim), *filter(None, [os.environ.get("PYTHONPATH")])]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}

    run = snakemake(tmp_path, "-n", "-p", env=env, timeout=300)
    out = run.stdout + run.stderr
    assert run.returncode == 0, out[-3000:]
    assert "tiny-b/answers.jsonl" in out and "responses.jsonl" not in out
    plan_rows = {m[1]: m[2] for m in re.finditer(r"^(tiny-[ab])\s+(\w+)", out, re.M)}
    assert plan_rows == {"tiny-a": "extract", "tiny-b": "generate"}, out[:3000]


def test_no_module_but_the_layout_spells_a_run_file_name():
    """A path built elsewhere would not follow a rename: only layout.py and rules/common.smk may name them."""
    layout = RunLayout.from_paths("r", "p")
    run_wide = ("providers", "ledger", "train_report", "evaluation", "curve", "run_summary",
                "run_summary_page", "report")
    members = [getattr(layout, name) for name in run_wide]
    members += [layout.responses(), layout.responses_summary(), layout.journal(), layout.tokens()]
    members += [layout.token_stats(), layout.hidden_done()]
    names = {path.name for path in members}
    repo = Path(__file__).resolve().parent.parent
    spelled = []
    for path in [*(repo / "eaglepipe").rglob("*.py"), *(repo / "scripts").glob("*.py")]:
        if path.name == "layout.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in names:
                spelled.append(f"{path.relative_to(repo)}:{node.lineno}: {node.value!r}")
    assert names and spelled == []
