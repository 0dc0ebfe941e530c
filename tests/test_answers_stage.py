"""The answers stage's one entry point: every answers rule runs one script, and naming a rule's source in its
params reruns no set finished before the param existed (Snakemake's own params check, run here)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from eaglepipe.answers.stage import SOURCES
from eaglepipe.config_types import Source

REPO = Path(__file__).resolve().parent.parent
RULE = """
from eaglepipe.config_types import Source

rule answers:
    output: "responses.jsonl"
    params: fingerprint="abc",{extra}
    shell: "echo answered > {{output}}"
"""


def snakemake(folder: Path, *args: str) -> str:
    run = subprocess.run(
        [sys.executable, "-m", "snakemake", "--cores", "1", "--rerun-triggers", "params", *args],
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    return run.stdout + run.stderr


@pytest.mark.parametrize(("param", "reruns"), [("source=Source.ENGINE", False), ('source="engine"', True)])
def test_naming_the_source_reruns_no_finished_set(tmp_path: Path, param: str, reruns: bool) -> None:
    """A str param would rerun the set (the control); the Enum the rules use does not."""
    (tmp_path / "Snakefile").write_text(RULE.format(extra=""))
    snakemake(tmp_path)
    (tmp_path / "Snakefile").write_text(RULE.format(extra=param))
    planned = snakemake(tmp_path, "-n")
    assert ("Nothing to be done" not in planned) is reruns, planned


def test_every_answers_rule_runs_the_one_script_and_names_a_source() -> None:
    rules = (REPO / "rules" / "generate.smk").read_text()
    bodies = dict(re.findall(r"^rule (\w+):\n((?:    .*\n|\n)+)", rules, re.M))
    answering = {name: body for name, body in bodies.items() if "responses=LAYOUT.responses()" in body}
    assert set(answering) == {"generate", "generate_engine", "import_answers"}
    named = {re.search(r"source=Source\.(\w+)", body).group(1) for body in answering.values()}
    assert named == {source.name for source in Source} == {source.name for source in SOURCES}
    assert {re.search(r'script:\n\s+"(.+)"', body).group(1) for body in answering.values()} == {
        "../scripts/answers.py"
    }
