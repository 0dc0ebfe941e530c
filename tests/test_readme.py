"""The README's commands run as written: every Snakemake command of its real-run and report sections, in a
fresh copy of this checkout, each as a dry run where it would buy or compute (`-n` added; the text is
otherwise untouched), with no key."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from eaglepipe.plan import command_line_targets

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parent.parent
SNAKEMAKE = ".venv/bin/snakemake"
SECTIONS = ("## The real run", "## Looking at a run: the report")


def section(readme: str, heading: str) -> str:
    start = readme.index(heading + "\n")
    end = readme.find("\n## ", start + len(heading))
    return readme[start: end if end != -1 else None]


def shell_blocks(text: str) -> list[str]:
    return re.findall(r"```sh\n(.*?)```", text, re.S)


def inline_commands(text: str) -> list[str]:
    prose = re.sub(r"```.*?```", "", text, flags=re.S)
    return [" ".join(code.split()) for code in re.findall(r"`([^`]+)`", prose) if code.startswith(SNAKEMAKE)]


def as_dry_run(script: str) -> str:
    """`-n` after every Snakemake call that would run jobs; a report, an unlock or a dry run stays."""
    def dry(match: re.Match[str]) -> str:
        rest = match.group(1)
        if re.search(r"(^|\s)(-n|--report|--unlock)(\s|$)", rest):
            return match.group(0)
        return f"{SNAKEMAKE} -n{rest}"

    return re.sub(rf"{re.escape(SNAKEMAKE)}([^\n#]*)", dry, script)


@pytest.fixture(scope="module")
def checkout(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tracked files, as a fresh clone has them, and this checkout's .venv."""
    root = tmp_path_factory.mktemp("clone")
    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout
    for name in tracked.decode().split("\0"):
        if name and (REPO / name).is_file():
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, root / name)
    (root / ".venv").symlink_to(REPO / ".venv")
    return root


def readme_commands() -> tuple[list[str], list[str]]:
    readme = (REPO / "README.md").read_text()
    sections = [section(readme, heading) for heading in SECTIONS]
    blocks = [block for text in sections for block in shell_blocks(text)]
    inline = [command for text in sections for command in inline_commands(text)]
    return blocks, inline


def test_the_sections_hold_the_commands_a_newcomer_types():
    blocks, inline = readme_commands()
    commands = [line for block in blocks for line in block.splitlines() if line.startswith(SNAKEMAKE)]
    assert len(commands) >= 5 and len(inline) >= 4
    assert not [line for block in blocks for line in block.splitlines() if line.startswith("snakemake ")]


@pytest.mark.parametrize("index", range(len(readme_commands()[0])))
def test_each_shell_block_runs_as_written(checkout: Path, index: int):
    script = readme_commands()[0][index]
    env = {key: value for key, value in os.environ.items() if key != "OPENROUTER_KEY_FILE"}
    env["HF_HUB_OFFLINE"] = "1"
    runs = [line for line in script.splitlines() if line.startswith(SNAKEMAKE)]
    if runs and all("--report" in line for line in runs):
        # A report needs a finished run (tests/test_report.py makes one and renders it): here, that
        # Snakemake's own parser takes the command line as written.
        for line in runs:
            assert command_line_targets(line.split(" #")[0].split()) == []
        return
    done = subprocess.run(["bash", "-euo", "pipefail", "-c", as_dry_run(script)], cwd=checkout, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"{script}\n{done.stderr[-3000:]}"
    assert "Traceback" not in done.stderr


def test_each_inline_command_runs_as_written(checkout: Path):
    _, inline = readme_commands()
    env = {key: value for key, value in os.environ.items() if key != "OPENROUTER_KEY_FILE"}
    env["HF_HUB_OFFLINE"] = "1"
    for command in inline:
        done = subprocess.run(["bash", "-c", as_dry_run(command)], cwd=checkout, env=env, capture_output=True,
                              text=True, timeout=600)
        assert done.returncode == 0, f"{command}\n{done.stderr[-3000:]}"
        assert "Traceback" not in done.stderr, command
    assert not (checkout / "results").exists() or not any((checkout / "results").rglob("responses.jsonl"))
