"""The in-place KV cache gives exactly the logits of transformers' own cache, through growth and row drops."""

import pytest
import torch
from transformers import DynamicCache

from eaglepipe.target.kv_cache import as_growing
from eaglepipe.target.load import load_target


@pytest.fixture(scope="module")
def model(model_dir):
    return load_target(model_dir)


@torch.no_grad()
def decode(model, prompts, steps, cache_of, drop_after=None):
    """Greedy logits of `steps` decode steps after a batched prefill, dropping row 0 after `drop_after`."""
    ids = torch.tensor(prompts)
    out = model(input_ids=ids, cache=DynamicCache(), use_cache=True, logits_to_keep=1)
    cache, logits, seen = cache_of(out.cache), out.logits[:, -1], []
    position = ids.shape[1]
    for step in range(steps):
        seen.append(logits)
        tokens = logits.argmax(-1)
        if step == drop_after:
            cache.batch_select_indices(torch.tensor([1, 2]))
            tokens = tokens[1:]
        out = model(
            input_ids=tokens[:, None],
            position_ids=torch.full((len(tokens), 1), position),
            cache=cache,
            use_cache=True,
        )
        logits, position = out.logits[:, -1], position + 1
    return seen


@pytest.mark.slow  # four 20-step decodes of the real model: about 10 s, more than the rest of the file
def test_growing_cache_decodes_exactly_like_transformers_own(model):
    prompts = [[100 + i + row for i in range(12)] for row in range(3)]
    for drop_after in (None, 3):
        # room 1 forces the buffers to double several times over 20 steps
        ours = decode(model, prompts, 20, lambda cache: as_growing(cache, room=1), drop_after)
        theirs = decode(model, prompts, 20, lambda cache: cache, drop_after)
        assert all(torch.equal(a, b) for a, b in zip(ours, theirs, strict=True))
