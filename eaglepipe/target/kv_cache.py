"""A transformers KV cache that appends without copying what it already holds.

transformers' DynamicLayer appends by concatenation, so every forward copies the whole cache. On these
memory-starved CPUs that copy cost a sixth of an emulator decode step at 24 rows and, for the evaluation's
batched verify forward, about as much as its matrix products. Here each layer keeps buffers with room to
spare (doubling when full), and a forward writes only its new slots.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor
from transformers.cache_utils import Cache, DynamicLayer

MIN_ROOM = 64  # slots reserved beyond the current length when a buffer is (re)allocated


class GrowingLayer(DynamicLayer):
    """A DynamicLayer whose keys and values are views of larger buffers ([rows, heads, slots, dim])."""

    def __init__(self, keys: Tensor, values: Tensor, room: int = MIN_ROOM) -> None:
        super().__init__()
        self.device = keys.device
        self.is_initialized = True
        self._reserve(keys, values, keys.shape[2] + room)

    def _reserve(self, keys: Tensor, values: Tensor, slots: int) -> None:
        length = keys.shape[2]
        self._keys = keys.new_empty((*keys.shape[:2], slots, keys.shape[3]))
        self._values = values.new_empty((*values.shape[:2], slots, values.shape[3]))
        self._keys[:, :, :length] = keys
        self._values[:, :, :length] = values
        self.keys, self.values = self._keys[:, :, :length], self._values[:, :, :length]

    def update(
        self, key_states: Tensor, value_states: Tensor, *args: Any, **kwargs: Any
    ) -> tuple[Tensor, Tensor]:
        start = self.keys.shape[2]
        end = start + key_states.shape[2]
        if end > self._keys.shape[2]:
            self._reserve(self.keys, self.values, max(2 * self._keys.shape[2], end + MIN_ROOM))
        self._keys[:, :, start:end] = key_states
        self._values[:, :, start:end] = value_states
        self.keys, self.values = self._keys[:, :, :end], self._values[:, :, :end]
        return self.keys, self.values

    def batch_select_indices(self, indices: Tensor) -> None:
        length = self.keys.shape[2]
        self._keys, self._values = self._keys[indices], self._values[indices]
        self.keys, self.values = self._keys[:, :, :length], self._values[:, :, :length]


def growing_cache(keys: list[Tensor], values: list[Tensor], room: int = MIN_ROOM) -> Cache:
    """A cache holding `keys[i]`/`values[i]` for layer i, with `room` free slots reserved per layer."""
    return Cache(layers=[GrowingLayer(k, v, room) for k, v in zip(keys, values, strict=True)])


def as_growing(cache: Cache, room: int = MIN_ROOM) -> Cache:
    """The same keys and values as `cache` (e.g. one a prefill filled), in a cache that grows in place."""
    layers = cache.layers
    return growing_cache([layer.keys for layer in layers], [layer.values for layer in layers], room)


@torch.no_grad()
def right_padded(tensors: list[Tensor], width: int) -> Tensor:
    """[rows, heads, width, dim] from per-row [1, heads, len, dim], zeros after each row's length."""
    return torch.cat([torch.nn.functional.pad(t, (0, 0, 0, width - t.shape[2])) for t in tensors])
