"""What the shards cost on disk and which samples get them. Torch-free: the spend plan imports it at parse
time, the extraction job uses the same numbers to refuse a disk too small."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

from eaglepipe.hidden import HiddenError

STORED_LAYERS = 4  # three auxiliary layers and the final one
BYTES_PER_VALUE = {"float32": 4, "bfloat16": 2, "float16": 2, "fp8": 1}
# Group-quantized formats: `bits` per value, one float16 scale per group of at most MAX_GROUP values.
PACKED_BITS = {"int4": 4, "int3": 3}
MAX_GROUP = 128
SCALE_BYTES = 2
# Per token beside the states: the int32 id and the uint8 loss mask; fp8 adds one float32 scale per layer.
ID_AND_MASK_BYTES = 5
FP8_SCALE_BYTES = 4 * STORED_LAYERS


def group_size(hidden_size: int) -> int:
    """The largest power of two from 8 to 128 that divides the width: codes pack into whole bytes, groups
    never straddle a layer's end, and a Hadamard rotation of that size exists (shards.GroupCodes)."""
    size = MAX_GROUP
    while size >= 8 and hidden_size % size:
        size //= 2
    if size < 8:
        raise HiddenError(
            f"hidden size {hidden_size} is not a multiple of 8: store it as hidden.dtype bfloat16 or fp8"
        )
    return size


def value_cost(dtype: str) -> str:
    """What one stored value costs, and what comes with it, in words for the plan's disk line."""
    if dtype in PACKED_BITS:
        return f"{PACKED_BITS[dtype]} bits, one bfloat16 scale a group"
    return f"{BYTES_PER_VALUE[dtype]} B" + (", one float32 scale a layer" if dtype == "fp8" else "")


def bytes_per_token(hidden_size: int, dtype: str) -> int:
    if dtype in PACKED_BITS:
        groups = hidden_size // group_size(hidden_size)
        per_layer = hidden_size * PACKED_BITS[dtype] // 8 + groups * SCALE_BYTES
        return STORED_LAYERS * per_layer + ID_AND_MASK_BYTES
    scales = FP8_SCALE_BYTES if dtype == "fp8" else 0
    return STORED_LAYERS * hidden_size * BYTES_PER_VALUE[dtype] + scales + ID_AND_MASK_BYTES


def select_rows(
    prompt_ids: list[str],
    lengths: list[int],
    *,
    max_samples: int | None,
    max_tokens: int | None,
    seed: int,
) -> list[int]:
    """The rows (in data order) that get hidden states when a set is capped: rows ranked by a seeded hash
    of their prompt id, taken while they fit. Per-id ranking keeps the choice stable when prompts are
    added to a set: an earlier pick stays picked unless a newcomer outranks it."""
    if max_samples is None and max_tokens is None:
        return list(range(len(prompt_ids)))
    ranked = sorted(
        range(len(prompt_ids)),
        key=lambda row: hashlib.sha256(f"{seed}:{prompt_ids[row]}".encode()).digest(),
    )
    chosen: list[int] = []
    tokens = 0
    for row in ranked:
        if max_samples is not None and len(chosen) >= max_samples:
            break
        if max_tokens is not None and tokens + lengths[row] > max_tokens:
            continue  # a shorter sample may still fit
        chosen.append(row)
        tokens += lengths[row]
    return sorted(chosen)


def capped_tokens(
    tokens: int, samples: int | None, *, max_samples: int | None, max_tokens: int | None
) -> int:
    """The spend plan's estimate of the tokens a set's shards will hold under the caps (samples of
    average length)."""
    if max_samples is not None and samples:
        tokens = round(tokens * min(1.0, max_samples / samples))
    return tokens if max_tokens is None else min(tokens, max_tokens)


def check_free_disk(shard_dir: Path, needed_bytes: int, keep_free_gb: float) -> None:
    """Refuse before computing when the shards still to write would leave less than `keep_free_gb`."""
    probe = Path(shard_dir)
    while not probe.exists():
        probe = probe.parent
    free = shutil.disk_usage(probe).free
    keep = int(keep_free_gb * 1e9)
    if free - needed_bytes < keep:
        raise HiddenError(
            f"{shard_dir}: the shards still to write take {needed_bytes / 1e9:,.2f} GB and "
            f"hidden.keep_free_gb is {keep_free_gb:g}, but only {free / 1e9:,.2f} GB are free: free disk, "
            "or lower hidden.max_samples / hidden.max_tokens, or store hidden.dtype fp8"
        )
