"""The target pieces a drafter shares: its token embedding and lm_head.

They are read straight from the target's safetensors files, so training or loading the drafter of a
1T-parameter target does not load the target.
"""

from __future__ import annotations

from pathlib import Path

from torch import Tensor

from eaglepipe.target.architecture import TargetArchitecture
from eaglepipe.target.weights import TargetFilesError, read_tensor, weight_files


def load_target_embeddings(target_dir: Path) -> tuple[Tensor, Tensor]:
    """(embed_tokens [vocab, H], lm_head [vocab, H]); a tied target's lm_head is its embedding."""
    target_dir = Path(target_dir)
    target = TargetArchitecture.from_dir(target_dir)
    files = weight_files(target_dir)
    embed = read_tensor(target_dir, target.embedding_weight, files)
    if target.lm_head_weight in files:
        return embed, read_tensor(target_dir, target.lm_head_weight, files)
    if not target.tie_word_embeddings:
        raise TargetFilesError(
            f"{target_dir}: no {target.lm_head_weight!r} and the config does not tie it to the embedding"
        )
    return embed, embed
