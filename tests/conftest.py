"""Shared fixtures: the real embedded model and the tiny targets, built once if the pipeline has not built
them yet, and a whole tiny run, built once per change of the code (tests/build_cache.py)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from budget import Budgets, shared_budget
from build_cache import cached, copy_of, file_identity, locked, source_key

from eaglepipe.target.convert import EMBEDDED_GGUF, convert_gguf, packaged_gguf
from eaglepipe.target.kimi_layout import ensure_kimi_layout
from eaglepipe.target.load import load_target_tokenizer
from eaglepipe.target.tiny import (
    TEACHER_FILES,
    TINY_TARGETS,
    is_current,
    trained_text_model,
    write_tiny_target,
)

REPO = Path(__file__).resolve().parent.parent
EMBEDDED_MODEL_DIR = REPO / "resources" / "models" / "smollm2-135m-instruct"


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(Budgets(), "eaglepipe-budgets")
    if worker := os.environ.get("PYTEST_XDIST_WORKER"):
        share_the_cores(int(worker.removeprefix("gw")), int(os.environ["PYTEST_XDIST_WORKER_COUNT"]))


HEAVY = ("slow", "vllm", "sglang", "slurm")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The modules with end-to-end or engine tests first. xdist (`--dist loadfile`) hands modules to its
    workers in this order as they free up, so the short ones fill the gaps at the end instead of one long
    module running alone on one core while the other waits."""
    heavy = {item.path for item in items if any(item.get_closest_marker(name) for name in HEAVY)}
    items.sort(key=lambda item: item.path not in heavy)


def share_the_cores(worker: int, workers: int) -> None:
    """Each xdist worker computes on its own share of the cores, and so does what it starts (Snakemake jobs,
    the emulator, vLLM). OpenMP threads that outnumber the free cores wait for each other at every op:
    with another job busy beside it, tests/test_kv_cache.py took 181 s on torch's two threads, 35 s on one.
    vLLM on the CPU binds its threads to the first core unless told otherwise, so two workers' engines
    would share that core and leave the other idle."""
    cores = os.cpu_count() or 1
    per_worker = max(1, cores // workers)
    first = worker * per_worker % cores
    os.environ.setdefault("OMP_NUM_THREADS", str(per_worker))
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", f"{first}-{first + per_worker - 1}")
    import torch

    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))


@pytest.fixture(scope="session")
def model_dir() -> Path:
    """The converted SmolLM2 directory; converting takes ~40 s, so it is shared with the pipeline's copy;
    under a lock, so xdist workers do not convert it twice, nor read it half written."""
    with locked(EMBEDDED_MODEL_DIR.parent / ".smollm2.lock"):
        if not (EMBEDDED_MODEL_DIR / "model.safetensors").is_file():
            convert_gguf(packaged_gguf(*EMBEDDED_GGUF), EMBEDDED_MODEL_DIR)
    return EMBEDDED_MODEL_DIR


@pytest.fixture(scope="session")
@shared_budget(480, reason="trains the tiny text model (2.5 min here), once per checkout")
def tiny_targets() -> dict[str, Path]:
    """The tiny Kimi-K2.5 and DeepSeek-V3 (eaglepipe/target/tiny.py), trained once (two to four minutes) for
    both and kept where the pipeline's `target_model` rule puts them; under a lock, so xdist workers and
    a running pipeline do not build them twice."""
    teacher = [REPO / path for path in TEACHER_FILES]
    directories = {name: REPO / "resources" / "models" / name for name in TINY_TARGETS}
    with locked(REPO / "resources" / "models" / ".tiny-targets.lock"):
        stale = [name for name, directory in directories.items() if not is_current(name, directory, teacher)]
        if stale:
            state, fingerprint = trained_text_model(teacher)
            for name in stale:
                write_tiny_target(name, directories[name], state, fingerprint)
    return directories


@pytest.fixture(scope="session")
def emulator_url(model_dir: Path) -> Iterator[str]:
    """One emulator (default endpoint table, no key, no credit limit) for the whole session: loading the
    model costs seconds, and tests read its stats as deltas, so sharing it is safe."""
    from eaglepipe.emulator.runner import running_emulator

    with running_emulator(model_dir) as base_url:
        yield base_url


@pytest.fixture(scope="session")
@shared_budget(240, reason="a whole tiny run through Snakemake (about 60 s), once per change of the code")
def tiny_pipeline(tmp_path_factory, model_dir: Path) -> Path:
    """The work directory of one full tiny run through Snakemake (tests/tiny_run.py), shared by the
    modules that inspect what a whole run leaves: it takes about a minute, so it is built once per change
    of the code (tests/build_cache.py) and copied into each session. Tests that change it restore it."""
    import tiny_run

    key = source_key([Path(tiny_run.__file__)], model=file_identity(model_dir / "model.safetensors"))
    built = cached("tiny-pipeline", key, lambda workdir: tiny_run.build_tiny_run(workdir, model_dir))
    return copy_of(built, tmp_path_factory.mktemp("pipeline") / "run")


@pytest.fixture(scope="session")
def kimi_dir(tmp_path_factory) -> Path:
    """A tokenizer directory in Kimi-K2.5's layout (eaglepipe.target.kimi_layout)."""
    return ensure_kimi_layout(tmp_path_factory.mktemp("kimi") / "tokenizer").directory


@pytest.fixture(scope="session")
def kimi(kimi_dir: Path):
    return load_target_tokenizer(kimi_dir)
