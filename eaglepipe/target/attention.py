"""Grouped-query attention that reads each key/value head in place, masked or not.

transformers' `sdpa` copies the KV cache once per query group whenever a mask is given (`repeat_kv`). The
evaluation's batched verify forward always passes one (each row keeps its own slots), so on the embedded
model (9 query heads over 3 KV heads) that copy took over half of every verify forward. torch's SDPA reads
grouped heads itself when asked (`enable_gqa`); this registers an attention function that always asks.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import AttentionInterface

GROUPED_SDPA = "eaglepipe_grouped_sdpa"


def grouped_sdpa(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """[B, heads, q, d] queries over [B, kv_heads, kv, d] keys -> ([B, q, heads, d], no weights).

    Without a mask, a multi-token query is causal (a prefill); with one, the mask alone decides.
    """
    causal = (
        attention_mask is None
        and query.shape[2] > 1
        and (is_causal if is_causal is not None else getattr(module, "is_causal", True))
    )
    out = torch.nn.functional.scaled_dot_product_attention(
        query,
        key,
        value,
        attn_mask=attention_mask,
        dropout_p=dropout,
        scale=scaling,
        is_causal=causal,
        enable_gqa=query.shape[1] != key.shape[1],
    )
    return out.transpose(1, 2).contiguous(), None


def use_grouped_sdpa(model: Any) -> None:
    """Switch a loaded transformers model to `grouped_sdpa`."""
    AttentionInterface.register(GROUPED_SDPA, grouped_sdpa)
    model.set_attn_implementation(GROUPED_SDPA)
