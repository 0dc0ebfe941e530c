"""Config validation: defaults filled, and every mistake reported in one line naming the key."""

from __future__ import annotations

import copy
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from eaglepipe.config import RUN_WIDE_FOLDERS, ConfigError, target_outside_datasets, validate_config
from eaglepipe.layout import RunLayout

REPO = Path(__file__).resolve().parent.parent
SCHEMA = REPO / "schemas" / "config.schema.yaml"


def real_config() -> dict:
    return yaml.safe_load((REPO / "config.yaml").read_text())


def test_real_config_is_valid_and_gets_defaults():
    config = validate_config(real_config(), SCHEMA)
    assert config["generation"]["concurrency"] == 2000
    assert config["budget"] == {
        "usd": 100,
        "output_tokens_per_dataset": 10_000_000,
        "price_per_m_tokens": {"input": 0.60, "output": 3.00},
        "policy": "share",
    }
    assert config["plan"] == {"tokens_per_s_per_request": 15, "gpu_tflops": 400, "load_gb_per_s": 2}
    assert config["routing"]["quantizations"] == ["int4"]
    assert config["tokens"]["on_mismatch"] == "drop"
    assert config["datasets"] == [f"B{i}" for i in range(1, 9)]


def test_local_config_only_overrides():
    local = yaml.safe_load((REPO / "config" / "local.yaml").read_text())
    assert set(local) <= set(real_config()), "config/local.yaml adds keys the real config does not have"


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [
        (lambda c: c["generation"].update(concurency=5), "'generation.concurency' is not allowed"),
        (lambda c: c.update(budgets={}), "'budgets' is not allowed"),
        (lambda c: c["generation"].update(concurrency=0), "'generation.concurrency' = 0"),
        (lambda c: c.setdefault("tokens", {}).update(on_mismatch="x"), "allowed values are ['drop', 'keep']"),
        (lambda c: c["datasets"].append("B9"), "no entry for prompt set 'B9'"),
        (lambda c: c["sources"]["B1"].update(type="csv"), "'sources.B1.type' = 'csv'"),
        (lambda c: c["sources"]["B1"].pop("name"), "'sources.B1' misses 'name'"),
        (lambda c: c["datasets"].append("drafter"), "'datasets.8'"),
        (lambda c: c["datasets"].append("logs"), "'datasets.8'"),
        (lambda c: c["routing"].update(quantizations="[int4, fp8]"), "pass it with --configfile"),
        (lambda c: c["generation"].update(concurrency="five"), "'generation.concurrency' = 'five'"),
    ],
)
def test_mistakes_name_the_key_in_one_line(mutate, expected):
    config = copy.deepcopy(real_config())
    mutate(config)
    with pytest.raises(ConfigError) as info:
        validate_config(config, SCHEMA)
    message = str(info.value)
    assert expected in message
    assert "\n" not in message


def test_the_command_line_hint_is_only_given_for_strings_that_spell_the_wanted_type():
    """'lots' is no number in any form: the --config hint would send the user after the wrong cause."""
    config = copy.deepcopy(real_config())
    config["generation"].update(concurrency="lots")
    with pytest.raises(ConfigError) as info:
        validate_config(config, SCHEMA)
    assert str(info.value) == "config key 'generation.concurrency' = 'lots': 'lots' is not of type 'integer'"


def test_snakemake_stops_before_any_job_with_one_line(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("generation: {concurency: 5}\n")
    run = subprocess.run(
        [sys.executable, "-m", "snakemake", "-n", "--configfile", str(bad)],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )
    assert run.returncode != 0
    assert "eaglepipe: config key 'generation.concurency' is not allowed" in run.stderr
    assert "Traceback" not in run.stderr


def test_numbers_and_booleans_given_as_strings_are_read_as_such():
    """What Snakemake's --config hands over for nested values: every scalar as a string."""
    config = copy.deepcopy(real_config())
    config["generation"].update(concurrency="5", stream="false", temperature="0.7")
    config["budget"]["usd"] = "0.5"
    validate_config(config, SCHEMA)
    assert (config["generation"]["concurrency"], config["generation"]["stream"]) == (5, False)
    assert (config["generation"]["temperature"], config["budget"]["usd"]) == (0.7, 0.5)


def test_nested_config_on_the_command_line_is_accepted(tmp_path):
    run = subprocess.run(
        [sys.executable, "-m", "snakemake", "-n", "-s", str(REPO / "Snakefile"), "--directory", str(tmp_path),
         "--configfile", str(REPO / "config.yaml"), "--config", 'generation={"concurrency": 5}'],
        capture_output=True, text=True, timeout=120, env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert "not of type" not in run.stderr


def test_a_target_of_a_set_outside_datasets_names_the_set_and_the_key(tmp_path):
    local = tmp_path / "local.yaml"
    local.write_text("datasets: [demo-chat]\n")
    files = [REPO / "config.yaml", local]
    demo = RunLayout.from_paths("results/demo", "resources/prompts")
    assert target_outside_datasets("results/demo/nope/hidden.done", ["demo-chat"], demo, files) == (
        f"results/demo/nope/hidden.done: nope is not in `datasets` ({local}): "
        "add it there, with a `sources` entry"
    )
    for fine in ("results/demo/demo-chat/hidden.done", "results/demo/drafter/config.json",
                 "results/demo/.ledger/ledger.jsonl", "results/demo/report.html", "all", "hidden",
                 "results/demo/demo-chat/hidden/shard-00000.safetensors"):
        assert target_outside_datasets(fine, ["demo-chat"], demo, files) is None, fine
    # A prompt folder of any name under the results root holds prompt files, not sets.
    prompts_inside = RunLayout.from_paths("results/demo", "results/demo/sets_in")
    target = "results/demo/sets_in/demo-x.jsonl"
    assert target_outside_datasets(target, ["demo-chat"], prompts_inside, files) is None


def test_another_configurations_file_names_the_option_that_reads_its_root():
    real = RunLayout.from_paths("results", "resources")
    for target in ("results/demo/drafter/model.safetensors", "results/demo/demo-chat/responses.jsonl"):
        problem = target_outside_datasets(target, ["B1"], real, [REPO / "config.yaml"])
        assert problem is not None and problem.startswith(f"{target}: not a file of this configuration")
        assert "--workflow-profile profiles/local" in problem


def test_a_file_inside_a_set_outside_datasets_names_the_set_not_another_configuration():
    real, files = RunLayout.from_paths("results", "resources"), [REPO / "config.yaml"]
    for target, ds in (
        ("results/B9/hidden/shard-00000.safetensors", "B9"),
        ("results/hidden/hidden.done", "hidden"),  # a set may be named like a set's folder
        ("results/hidden/hidden/shard-00000.safetensors", "hidden"),
    ):
        problem = target_outside_datasets(target, ["B1"], real, files)
        assert problem is not None and problem.startswith(f"{target}: {ds} is not in `datasets`"), target
    # Under the results root but no set's file: a set's folder itself, a run-wide folder's, or under a name
    # the schema refuses for a set.
    for target in ("results/B9", "results/figures/x.txt", "results/prompts/B9.jsonl", "results/.tmp/B9/x"):
        assert target_outside_datasets(target, ["B1"], real, files) is None, target


def test_the_run_wide_folders_are_the_set_names_the_schema_refuses():
    datasets = yaml.safe_load(SCHEMA.read_text())["properties"]["datasets"]
    assert sorted(datasets["items"]["not"]["enum"]) == sorted(RUN_WIDE_FOLDERS)


@pytest.mark.slow
def test_a_dry_run_for_a_set_outside_datasets_stops_with_one_line_and_no_plan():
    run = subprocess.run(
        [sys.executable, "-m", "snakemake", "-n", "results/B9/hidden.done"],
        cwd=REPO, capture_output=True, text=True, timeout=120, env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    assert run.returncode != 0
    assert run.stderr.strip().splitlines()[-1] == (
        "eaglepipe: results/B9/hidden.done: B9 is not in `datasets` (config.yaml): add it there, "
        "with a `sources` entry"
    )
    assert "spend plan" not in run.stderr and "No rule to produce" not in run.stderr
