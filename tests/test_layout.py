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

from eaglepipe.config import RUN_WIDE_FOLDERS
from eaglepipe.layout import BUILDERS, WILDCARD, RunLayout, RunPath

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
    for path in [*(repo / "eaglepipe").rglob("*.py"), *repo.glob("scripts/*.py"), *repo.glob("bench/*.py")]:
        if path.name == "layout.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in names:
                spelled.append(f"{path.relative_to(repo)}:{node.lineno}: {node.value!r}")
    assert names and spelled == []


LAYOUTS = (
    RunLayout.from_paths("results/demo/", "results/demo/prompts"),  # the prompts inside the results root
    RunLayout.from_paths("results", "resources/prompts"),
    RunLayout.from_paths("/scratch/run/results", "/scratch/run/prompts"),
)
# A set named like a set's own folder ("hidden") is allowed; the wildcard is how the rules call members.
ARGUMENTS = {
    "ds": ("B5", "hidden", WILDCARD),
    "stem": ("curve",),
    "name": ("providers.log", "generate/B5.log"),
}


def test_classify_reads_back_what_every_member_builds():
    for layout in LAYOUTS:
        for kind, argument in BUILDERS.items():
            if argument is None:
                assert layout.classify(getattr(layout, kind)) == RunPath(kind), kind
                continue
            for value in ARGUMENTS[argument]:
                path = getattr(layout, kind)(value)
                expected = RunPath(kind, value if argument == "ds" else None)
                assert layout.classify(path) == expected, path
                assert layout.classify(str(path)) == expected, path


def test_every_member_that_builds_a_path_is_read_back():
    """A member missing from BUILDERS (no `-> Path`) would be read as its folder's or its root's."""
    members = {name for name in vars(RunLayout) if not name.startswith("_")} - {"from_paths", "classify"}
    assert members == set(BUILDERS)
    assert set(ARGUMENTS) == {argument for argument in BUILDERS.values() if argument}


def test_a_path_outside_the_roots_is_none():
    layout = RunLayout.from_paths("results/demo", "results/demo/prompts")
    outside = ("all", "hidden", "results", "results/demo-a/hidden.done", "/results/demo/B5/hidden.done")
    for path in (*outside, "../results/demo/B5/hidden.done", "resources/prompts/B5.jsonl"):
        assert layout.classify(path) is None, path


def test_a_path_inside_a_members_folder_names_that_member_and_the_parts_below():
    layout = RunLayout.from_paths("results", "resources/prompts")
    assert layout.classify("results/B5/hidden/shard-00000.safetensors") == RunPath(
        "shards", "B5", ("shard-00000.safetensors",)
    )
    assert layout.classify("results/.ledger/ledger.jsonl") == RunPath("ledger", below=("ledger.jsonl",))
    assert layout.classify("results/drafter/snapshots/step-10") == RunPath("snapshots", below=("step-10",))
    assert layout.classify("results/B5/.journal/x.jsonl") == RunPath("journal", "B5", ("x.jsonl",))
    assert layout.classify("results/B5/notes.txt") == RunPath("set_dir", "B5", ("notes.txt",))
    # Another configuration's file, one folder deeper: a set's folder with a folder the layout never makes.
    assert layout.classify("results/demo/demo-chat/responses.jsonl") == RunPath(
        "set_dir", "demo", ("demo-chat", "responses.jsonl")
    )
    assert layout.classify("results") == RunPath("results")
    assert layout.classify("resources/prompts/old/B5.jsonl") == RunPath("prompts", below=("old", "B5.jsonl"))
    # Targets as typed on a command line.
    assert layout.classify("./results/B5/hidden.done") == RunPath("hidden_done", "B5")
    assert layout.classify("results/B5/") == RunPath("set_dir", "B5")


def test_no_set_takes_a_run_wide_folders_name():
    """A set named after a run-wide folder would share it (results/drafter/responses.jsonl): the layout reads
    such a path as the folder's, and the config schema refuses the name."""
    layout = RunLayout.from_paths("results", "results/prompts")
    assert layout.classify(layout.responses("drafter")) == RunPath("drafter", below=("responses.jsonl",))
    assert layout.classify(layout.responses("logs")) == RunPath("log")  # logs/responses.jsonl: a log's name
    assert layout.classify(layout.set_dir("figures")) == RunPath("results", below=("figures",))
    # The prompts root inside the results root holds prompt sets, even one named like a set's file.
    assert layout.classify(layout.prompt_set("responses")) == RunPath("prompt_set", "responses")
    # So every run-wide folder that could be a set's name is one the schema refuses (RUN_WIDE_FOLDERS).
    run_wide = [
        getattr(layout, kind) if argument is None else getattr(layout, kind)("x")
        for kind, argument in BUILDERS.items()
        if argument != "ds"
    ]
    folders = {path.relative_to(layout.results).parts[0] for path in run_wide}
    schema = Path(__file__).resolve().parent.parent / "schemas" / "config.schema.yaml"
    pattern = yaml.safe_load(schema.read_text())["properties"]["datasets"]["items"]["pattern"]
    named_like_sets = {folder for folder in folders if re.fullmatch(pattern, folder)}
    assert named_like_sets and named_like_sets <= set(RUN_WIDE_FOLDERS)


def test_a_renamed_member_is_read_back_under_its_new_name(monkeypatch):
    monkeypatch.setattr(RunLayout, "responses", lambda self, ds=WILDCARD: self.set_dir(ds) / "answers.jsonl")
    layout = RunLayout.from_paths("results", "resources/prompts")
    assert layout.classify("results/B5/answers.jsonl") == RunPath("responses", "B5")
    assert layout.classify("results/B5/responses.jsonl") == RunPath("set_dir", "B5", ("responses.jsonl",))
