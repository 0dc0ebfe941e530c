"""Derive the conda environments and the GPU constraints from the one pinned set, `constraints.txt`.

`python -m eaglepipe.envs --write` regenerates them; a test fails when a derived file has drifted.
"""

from __future__ import annotations

import argparse
import re
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

# What a GPU node needs instead of the CPU pins: sglang's own torch and transformers requirements.
# SGLang 0.5.14 (what the sglang backend is written against, as SpecForge pins it) requires exactly these.
GPU_OVERRIDES = {"torch": "2.11.0", "transformers": "5.8.1", "sglang": "0.5.14"}

# Rule groups and the direct dependencies their jobs import.
ENV_GROUPS = {
    "pipeline": "CPU and network stages: prompts, generation, token ids",
    "gpu": "GPU stages: hidden states, drafter training and evaluation (adds sglang)",
}


def _normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def read_pins(path: Path) -> dict[str, str]:
    pins = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, version = line.split("==")
            pins[_normalize(name)] = version
    return pins


def direct_dependencies(pyproject: Path) -> dict[str, list[str]]:
    project = tomllib.loads(pyproject.read_text())["project"]
    return {
        "base": [_normalize(d) for d in project["dependencies"]],
        **{extra: [_normalize(d) for d in deps] for extra, deps in project["optional-dependencies"].items()},
    }


def derived_files(repo: Path = REPO) -> dict[Path, str]:
    """Every derived file's path and exact expected content."""
    pins = read_pins(repo / "constraints.txt")
    deps = direct_dependencies(repo / "pyproject.toml")
    gpu_pins = {**pins, **GPU_OVERRIDES}
    files = {}
    for group, purpose in ENV_GROUPS.items():
        names = deps["base"] + (deps["gpu"] if group == "gpu" else [])
        versions = gpu_pins if group == "gpu" else pins
        lines = [f"      - {name}=={versions[name]}" for name in names]
        files[repo / "envs" / f"{group}.yaml"] = (
            f"# {purpose}. Derived from constraints.txt by `python -m eaglepipe.envs --write`: do not edit.\n"
            f"name: eaglepipe-{group}\nchannels: [conda-forge]\ndependencies:\n  - python=3.11\n  - pip\n"
            "  - pip:\n" + "\n".join(lines) + "\n"
        )
    gpu_lines = [f"{name}=={version}" for name, version in sorted(gpu_pins.items())]
    files[repo / "constraints-gpu.txt"] = (
        "# GPU nodes: constraints.txt with sglang's torch and transformers.\n"
        "# Derived by `python -m eaglepipe.envs --write`: do not edit.\n"
        "# Install: pip install -c constraints-gpu.txt -e '.[gpu]'\n"
        + "\n".join(gpu_lines) + "\n"
    )
    return files


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="rewrite the derived files")
    args = parser.parse_args()
    stale = [path for path, text in derived_files().items() if not path.is_file() or path.read_text() != text]
    if args.write:
        for path, text in derived_files().items():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
        print(f"wrote {len(derived_files())} files")
    elif stale:
        raise SystemExit(f"stale: {', '.join(str(p.relative_to(REPO)) for p in stale)}; run with --write")


if __name__ == "__main__":
    main()
