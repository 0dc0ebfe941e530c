"""The draft vocabulary: the target ids the drafter can propose, and the checkpoint's mapping tensors."""

from __future__ import annotations

import torch
from torch import Tensor

from eaglepipe.drafter import DrafterError


def build_draft_vocab(token_counts: Tensor, draft_vocab_size: int, vocab_size: int) -> tuple[Tensor, Tensor]:
    """(d2t int64 [draft], t2d bool [vocab]) for the most frequent completion tokens.

    `token_counts[i]` counts target id i (ids past the end count zero).
    A smaller head is cheaper to train and to run; tokens the target rarely emits cost little acceptance.
    Ties go to the lower id, and ids never seen fill the remainder lowest first, so the size is fixed and
    the choice reproducible. Draft ids follow target ids in ascending order; target id = i + d2t[i].
    """
    if token_counts.numel() > vocab_size:
        raise DrafterError(
            f"completion token ids reach {token_counts.numel() - 1}, beyond the target vocab "
            f"({vocab_size}): the hidden states were made with another tokenizer"
        )
    if not 0 < draft_vocab_size <= vocab_size:
        raise DrafterError(f"draft_vocab_size {draft_vocab_size}: use 1..{vocab_size} (the target vocab)")
    counts = torch.zeros(vocab_size, dtype=torch.long)
    counts[: token_counts.numel()] = token_counts
    by_frequency = torch.sort(-counts, stable=True).indices
    target_ids = by_frequency[:draft_vocab_size].sort().values
    d2t = target_ids - torch.arange(draft_vocab_size)
    t2d = torch.zeros(vocab_size, dtype=torch.bool)
    t2d[target_ids] = True
    return d2t, t2d
