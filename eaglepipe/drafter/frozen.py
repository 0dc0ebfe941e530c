"""The target pieces a drafter shares: its config, token embedding and lm_head.

They are read straight from the target's safetensors files, so training or loading the drafter of a
1T-parameter target does not load the target.
"""

from __future__ import annotations

from pathlib import Path

from torch import Tensor

from eaglepipe.target.weights import (
    TargetFilesError,
    only_name,
    read_target_config,
    read_tensor,
    weight_files,
)


def load_target_embeddings(target_dir: Path) -> tuple[Tensor, Tensor]:
    """(embed_tokens [vocab, H], lm_head [vocab, H]); a tied target's lm_head is its embedding."""
    target_dir = Path(target_dir)
    files = weight_files(target_dir)
    embed = read_tensor(target_dir, files, only_name(target_dir, files, "embed_tokens.weight"))
    head_names = [name for name in files if name.endswith("lm_head.weight")]
    if len(head_names) == 1:
        return embed, read_tensor(target_dir, files, head_names[0])
    config = read_target_config(target_dir)
    tied = config.get("tie_word_embeddings", (config.get("text_config") or {}).get("tie_word_embeddings"))
    if head_names or tied is False:
        raise TargetFilesError(f"{target_dir}: lm_head weights {head_names}: expected one, or a tied target")
    return embed, embed
