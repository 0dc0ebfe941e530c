"""The whole DAG through Snakemake itself, on the tiny config (tests/tiny_run.py): real emulator, real
model, real training, one run shared by the checks.

What it leaves, that a rerun has nothing to do, that an edited prompt file reruns only its own chain plus
the drafter, that refreshing providers.json alone reruns nothing, and that the tiny run (results root
results/demo, like the embedded default) and the real config (results/) never plan, spend or satisfy
each other's work.
"""

from __future__ import annotations

import json
import os
import re
import shutil

import pytest
from tiny_run import PROMPTS, REPO, RESULTS_ROOT, planned_jobs, snakemake, write_prompts

pytestmark = pytest.mark.slow

# What the real config plans on a fresh clone (tests/test_dryrun.py checks the same table there).
REAL_FRESH_PLAN = {"prompts": 8, "providers": 1, "generation_settings": 1, "generate": 8, "tokens": 8,
                   "hidden": 8, "train_drafter": 1, "describe_drafter": 1, "evaluate_drafter": 1,
                   "figures": 1, "all": 1}


def real_dry_run(workdir, *args):
    env = {k: v for k, v in os.environ.items() if k != "OPENROUTER_KEY_FILE"}
    env["HF_HUB_OFFLINE"] = "1"
    return snakemake(workdir, "-n", *args, configfile=REPO / "config.yaml", env=env)


def test_every_artifact_exists(tiny_pipeline):
    results = tiny_pipeline / RESULTS_ROOT
    for ds in PROMPTS:
        for name in ("responses.jsonl", "responses.summary.json", "tokens.safetensors", "tokens.json",
                     "hidden.done"):
            assert (results / ds / name).is_file(), f"{ds}/{name}"
        manifest = json.loads((results / ds / "hidden.done").read_text())
        assert manifest["num_samples"] == len(PROMPTS[ds])
        assert all((results / ds / s["path"]).is_file() for s in manifest["shards"])
    for name in ("config.json", "model.safetensors", "train.json", "eval.json", "README.md", "target.json"):
        assert (results / "drafter" / name).is_file()
    assert json.loads((results / "drafter" / "config.json").read_text())["architectures"] == [
        "LlamaForCausalLMEagle3"
    ]


def test_the_run_writes_nothing_outside_its_results_root(tiny_pipeline):
    """Its prompts, providers.json, ledger and logs included: only the sources and the config are beside it
    (and Snakemake's own .snakemake/)."""
    beside = sorted(p.name for p in tiny_pipeline.iterdir())
    assert beside == [".snakemake", "results", "sources", "tiny.yaml"]
    assert sorted(p.name for p in (tiny_pipeline / "results").iterdir()) == ["demo"]
    results = tiny_pipeline / RESULTS_ROOT
    for name in ("providers.json", ".ledger/ledger.jsonl", "prompts/tiny-a.jsonl", "logs/hidden/tiny-a.log",
                 "logs/train_drafter.log"):
        assert (results / name).is_file(), name


def test_responses_carry_usage_and_token_ids(tiny_pipeline):
    lines = (tiny_pipeline / RESULTS_ROOT / "tiny-a" / "responses.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    assert len(records) == 4
    for record in records:
        assert record["usage"]["completion_tokens"] >= 1 and record["usage"]["cost"] > 0
        assert record["provider"] and record["response"]["token_ids"]
    stats = json.loads((tiny_pipeline / RESULTS_ROOT / "tiny-a" / "tokens.json").read_text())
    assert stats["billed"]["relative_difference"] == 0


def test_evaluation_uses_held_out_prompts_only(tiny_pipeline):
    train = json.loads((tiny_pipeline / RESULTS_ROOT / "drafter" / "train.json").read_text())
    evaluation = json.loads((tiny_pipeline / RESULTS_ROOT / "drafter" / "eval.json").read_text())
    assert len(train["holdout_ids"]) == 2
    assert sorted(evaluation["prompt_ids"]) == sorted(train["holdout_ids"])
    assert [p["id"] for p in evaluation["prompts"]] == evaluation["prompt_ids"]
    sets = sorted({p["set"] for p in evaluation["prompts"]})
    assert sorted(evaluation["per_set"]) == sets == sorted(PROMPTS)
    assert evaluation["k"] == 3 and evaluation["engine"].startswith("eaglepipe")
    # Speculation must not change the output: every method emits the target's own greedy tokens.
    assert evaluation["outputs_identical_across_methods"] is True
    methods = evaluation["methods"]
    assert len({methods[m]["tokens"] for m in ("eagle3", "eagle3_untrained", "prompt_lookup")}) == 1
    for method in methods.values():
        assert method["acceptance_length"] == round(method["tokens"] / method["target_forwards"], 4)


def test_rerun_has_nothing_to_do(tiny_pipeline):
    run = snakemake(tiny_pipeline, "-n")
    assert run.returncode == 0 and planned_jobs(run) == {}, run.stdout[-2000:]


def test_the_real_config_plans_its_whole_chain_beside_a_finished_embedded_run(tiny_pipeline):
    run = real_dry_run(tiny_pipeline)
    assert run.returncode == 0, run.stderr[-2000:]
    assert planned_jobs(run) == REAL_FRESH_PLAN
    assert "results root: results/ " in run.stderr
    assert "budget.usd $100.00: $0.0000 spent so far" in run.stderr
    # Nothing of the tiny run is named in the real plan: not its sets, root, prompts or drafter.
    assert "tiny-" not in run.stdout + run.stderr and RESULTS_ROOT not in run.stdout


def test_real_config_files_change_nothing_the_embedded_run_plans(tiny_pipeline):
    """The reverse: the real run's providers.json, ledger (money spent), drafter and a set's files in
    place change nothing the tiny config plans, and the real config does see them (they are real)."""
    real = tiny_pipeline / "results"
    (real / ".ledger").mkdir(parents=True)
    billed = {"event": "billed", "set": "B1", "prompt_id": "p", "generation_id": "g", "usd": 12.5,
              "outcome": "kept"}
    (real / ".ledger" / "ledger.jsonl").write_text(json.dumps(billed) + "\n")
    endpoint = {"tag": "x/int4", "provider_name": "X", "pricing": {"prompt": "1e-6", "completion": "3e-6"}}
    (real / "providers.json").write_text(json.dumps({"model": "moonshotai/kimi-k2.5", "kept": [endpoint]}))
    (real / "drafter").mkdir()
    for name in ("config.json", "model.safetensors", "train.json", "eval.json", "README.md", "target.json"):
        (real / "drafter" / name).write_text("{}")
    (real / "B1").mkdir()
    for name in ("responses.jsonl", "tokens.safetensors", "tokens.json", "hidden.done"):
        (real / "B1" / name).write_text("")
    try:
        tiny = snakemake(tiny_pipeline, "-n")
        assert tiny.returncode == 0 and planned_jobs(tiny) == {}, tiny.stdout[-2000:]
        assert "$12.5" not in tiny.stderr and "x/int4" not in tiny.stderr

        seen = real_dry_run(tiny_pipeline)
        assert "budget.usd $100.00: $12.5000 spent so far" in seen.stderr
        # B1 and providers.json count as done; the drafter needs every set, so it is planned anyway.
        assert planned_jobs(seen) == {"prompts": 7, "generation_settings": 1, "generate": 7, "tokens": 7,
                                      "hidden": 7, "train_drafter": 1, "describe_drafter": 1,
                                      "evaluate_drafter": 1, "figures": 1, "all": 1}
    finally:
        for name in (".ledger", "providers.json", "drafter", "B1"):
            path = real / name
            shutil.rmtree(path) if path.is_dir() else path.unlink()


def test_refreshing_providers_reruns_nothing_else(tiny_pipeline):
    run = snakemake(tiny_pipeline, "--forcerun", "providers", "--until", "providers")
    assert run.returncode == 0, run.stderr[-2000:]
    assert planned_jobs(snakemake(tiny_pipeline, "-n")) == {}


def test_editing_one_prompt_file_reruns_only_its_chain(tiny_pipeline):
    source = tiny_pipeline / "sources" / "tiny-b.jsonl"
    original, stat = source.read_text(), source.stat()
    write_prompts(tiny_pipeline, "tiny-b", [*PROMPTS["tiny-b"][:3], "Name an animal."])
    try:
        jobs = planned_jobs(snakemake(tiny_pipeline, "-n"))
        assert jobs == {"prompts": 1, "generate": 1, "tokens": 1, "hidden": 1, "train_drafter": 1,
                        "describe_drafter": 1, "evaluate_drafter": 1, "figures": 1, "all": 1}
    finally:  # the run is shared with other modules: leave it as it was
        source.write_text(original)
        os.utime(source, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert planned_jobs(snakemake(tiny_pipeline, "-n")) == {}


def test_a_broken_source_keeps_its_set_and_putting_it_back_reruns_nothing(tiny_pipeline):
    """A broken edit stops the run before any job (a failed job would have deleted the built set, and its
    rebuild would rerun the whole chain); the same bytes back, with a new mtime, plan nothing."""
    source = tiny_pipeline / "sources" / "tiny-b.jsonl"
    built = tiny_pipeline / RESULTS_ROOT / "prompts" / "tiny-b.jsonl"
    original, built_mtime = source.read_bytes(), built.stat().st_mtime_ns
    source.write_bytes(original + b'{"messages": [{"role": "user"\n')
    run = snakemake(tiny_pipeline)
    assert run.returncode != 0
    last = run.stderr.strip().splitlines()[-1]
    assert last.startswith("eaglepipe: ") and "tiny-b.jsonl:5" in last and "is kept" in last, last
    assert built.stat().st_mtime_ns == built_mtime
    source.write_bytes(original)
    assert planned_jobs(snakemake(tiny_pipeline, "-n")) == {}


def test_log_paths_are_under_the_results_root_in_every_rule():
    """Logs are outputs too: every `log:` entry is the layout's LAYOUT.log(), under the root."""
    for rule_file in (REPO / "rules").glob("*.smk"):
        lines = rule_file.read_text().splitlines()
        for number, line in enumerate(lines):
            if line.strip() != "log:":
                continue
            indent = len(line) - len(line.lstrip())
            entries = []
            for entry in lines[number + 1:]:
                if len(entry) - len(entry.lstrip()) <= indent:
                    break
                entries.append(entry.strip())
            # `**emulator_log(LAYOUT.log(...))`: a log only some configs have, still the layout's path.
            built_by_layout = all(re.match(r"(\w+=|\*\*\w+\()?LAYOUT\.log\(", entry) for entry in entries)
            assert entries and built_by_layout, f"{rule_file.name}: {entries}"
