"""Shared fixtures: the real embedded model, built once if the pipeline has not built it yet."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from eaglepipe.target.convert import EMBEDDED_GGUF, convert_gguf, packaged_gguf
from eaglepipe.target.kimi_layout import ensure_kimi_layout
from eaglepipe.target.tokenizer import load_target_tokenizer

REPO = Path(__file__).resolve().parent.parent
EMBEDDED_MODEL_DIR = REPO / "resources" / "models" / "smollm2-135m-instruct"


@pytest.fixture(scope="session")
def model_dir() -> Path:
    """The converted SmolLM2 directory; converting takes ~40 s, so it is shared with the pipeline's copy."""
    if not (EMBEDDED_MODEL_DIR / "model.safetensors").is_file():
        convert_gguf(packaged_gguf(*EMBEDDED_GGUF), EMBEDDED_MODEL_DIR)
    return EMBEDDED_MODEL_DIR


@pytest.fixture(scope="session")
def emulator_url(model_dir: Path) -> Iterator[str]:
    """One emulator (default endpoint table, no key, no credit limit) for the whole session: loading the
    model costs seconds, and tests read its stats as deltas, so sharing it is safe."""
    from eaglepipe.emulator.runner import running_emulator

    with running_emulator(model_dir) as base_url:
        yield base_url


@pytest.fixture(scope="session")
def tiny_pipeline(tmp_path_factory, model_dir: Path) -> Path:
    """The work directory of one full tiny run through Snakemake (tests/tiny_run.py), shared by the
    modules that inspect what a whole run leaves: it takes minutes. Tests that change it restore it."""
    from tiny_run import build_tiny_run

    workdir = tmp_path_factory.mktemp("pipeline")
    build_tiny_run(workdir, model_dir)
    return workdir


@pytest.fixture(scope="session")
def kimi_dir(tmp_path_factory) -> Path:
    """A tokenizer directory in Kimi-K2.5's layout (eaglepipe.target.kimi_layout)."""
    return ensure_kimi_layout(tmp_path_factory.mktemp("kimi") / "tokenizer").directory


@pytest.fixture(scope="session")
def kimi(kimi_dir: Path):
    return load_target_tokenizer(kimi_dir)
