"""A serving node that has the target under its hub name and no network: the model folder laid out as a
Hugging Face cache (`HF_HOME/hub/models--ORG--NAME/snapshots/REV`, `refs/main`), which huggingface_hub,
transformers, speculators and vLLM resolve by name with HF_HUB_OFFLINE=1, exactly as after a download. As in
a real cache, the snapshot's files are links to the stored files (here the model folder's): a copy of each
tiny target's 360 MB of weights per test session is what ran a small CI disk out (stop 42)."""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path


def serving_node_with(model_dir: Path, name: str, home: Path) -> dict[str, str]:
    """Lay `model_dir` out as a cache at `home` under the hub id `name`; the environment that uses it."""
    revision = hashlib.sha1(name.encode()).hexdigest()
    repo = home / "hub" / f"models--{name.replace('/', '--')}"
    snapshot = repo / "snapshots" / revision
    shutil.copytree(model_dir.resolve(), snapshot, copy_function=os.symlink, dirs_exist_ok=True)
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    (repo / "refs" / "main").write_text(revision)
    return {"HF_HOME": str(home), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
