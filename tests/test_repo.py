"""Repository-level promises: lint-clean code and rules, derived environments in sync with the pins."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

from eaglepipe.envs import derived_files, read_pins

REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent


def test_ruff_is_clean():
    command = [str(BIN / "ruff"), "check", "--no-cache", "."]
    run = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
    assert run.returncode == 0, run.stdout


def test_snakemake_lint_is_clean():
    run = subprocess.run(
        [sys.executable, "-m", "snakemake", "--lint"], cwd=REPO, capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, run.stdout + run.stderr


def test_the_license_is_the_spdx_string_setuptools_reads_without_a_deprecation_warning():
    """A TOML table (`{text = ...}`) makes `pip install -e .` warn twice; the string needs setuptools 77."""
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert pyproject["project"]["license"] == "Apache-2.0"
    assert pyproject["build-system"]["requires"] == ["setuptools>=77"]


def test_derived_environments_agree_with_the_pins():
    for path, expected in derived_files(REPO).items():
        assert path.read_text() == expected, f"{path.name} drifted: run `python -m eaglepipe.envs --write`"


def test_installed_versions_are_the_pinned_ones():
    from importlib.metadata import version

    pins = read_pins(REPO / "constraints.txt")
    for name in ("snakemake", "httpx", "anyio", "transformers", "safetensors", "jsonschema", "pyyaml",
                 "matplotlib"):
        assert version(name) == pins[name], f"{name}: installed {version(name)}, pinned {pins[name]}"
    assert version("torch").split("+")[0] == pins["torch"]


def test_every_rule_names_its_conda_env_and_log():
    rules = "".join(p.read_text() for p in (REPO / "rules").glob("*.smk"))
    count = len(re.findall(r"^\s*rule \w+:", rules, re.M))
    assert count == 15
    assert len(re.findall(r"^\s*conda:", rules, re.M)) == len(re.findall(r"^\s*log:", rules, re.M)) == count


def test_readme_opens_with_the_two_setup_commands_and_ci_runs_the_second():
    readme = (REPO / "README.md").read_text().splitlines()
    block = readme[readme.index("```sh") + 1 : readme.index("```", readme.index("```sh") + 1)]
    commands = [line.split("#")[0].strip() for line in block if line.strip()]
    assert commands == ["make demo", "make test"]
    assert "make test" in (REPO / ".ci" / "run").read_text()
