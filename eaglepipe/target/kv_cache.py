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
from transformers.cache_utils import Cache, CacheLayerMixin, DynamicLayer

MIN_ROOM = 64  # slots reserved beyond the current length when a buffer is (re)allocated


class GrowingLayer(DynamicLayer):
    """A DynamicLayer whose keys and values are views of larger buffers ([rows, heads, slots, dim]).

    It starts from blocks of rows ([rows, heads, len, dim] each, stacked in order), copied once into its
    buffers; a block shorter than the longest is zero after its length, which its caller masks out.
    """

    # Set from the start, unlike a DynamicLayer's (None until its first update).
    keys: Tensor
    values: Tensor

    def __init__(self, keys: list[Tensor], values: list[Tensor], room: int = MIN_ROOM) -> None:
        super().__init__()
        self.device = keys[0].device
        self.is_initialized = True
        length = max(block.shape[2] for block in keys)
        self._keys, self._values = _stacked(keys, length + room), _stacked(values, length + room)
        self.keys, self.values = self._keys[:, :, :length], self._values[:, :, :length]

    def update(
        self, key_states: Tensor, value_states: Tensor, *args: Any, **kwargs: Any
    ) -> tuple[Tensor, Tensor]:
        start = self.keys.shape[2]
        end = start + key_states.shape[2]
        if end > self._keys.shape[2]:
            slots = max(2 * self._keys.shape[2], end + MIN_ROOM)
            self._keys, self._values = _stacked([self.keys], slots), _stacked([self.values], slots)
        self._keys[:, :, start:end] = key_states
        self._values[:, :, start:end] = value_states
        self.keys, self.values = self._keys[:, :, :end], self._values[:, :, :end]
        return self.keys, self.values

    def batch_select_indices(self, indices: Tensor) -> None:
        """Keep only the rows `indices`: their filled slots are copied, the room is reserved, not copied."""
        length = self.keys.shape[2]
        self._keys, self._values = (
            _selected(self._keys, indices, length),
            _selected(self._values, indices, length),
        )
        self.keys, self.values = self._keys[:, :, :length], self._values[:, :, :length]


def _selected(buffer: Tensor, rows: Tensor, length: int) -> Tensor:
    selected = buffer.new_empty((len(rows), *buffer.shape[1:]))
    torch.index_select(buffer[:, :, :length], 0, rows, out=selected[:, :, :length])
    return selected


def _stacked(blocks: list[Tensor], slots: int) -> Tensor:
    """The blocks stacked along rows in a new [rows, heads, slots, dim] buffer, zero after each block."""
    first = blocks[0]
    rows = sum(block.shape[0] for block in blocks)
    buffer = first.new_zeros((rows, first.shape[1], slots, first.shape[3]))
    row = 0
    for block in blocks:
        buffer[row : row + block.shape[0], :, : block.shape[2]] = block
        row += block.shape[0]
    return buffer


def growing_cache(keys: list[list[Tensor]], values: list[list[Tensor]], room: int = MIN_ROOM) -> Cache:
    """A cache whose layer i holds the row blocks `keys[i]`/`values[i]`, with `room` free slots reserved."""
    return Cache(layers=[GrowingLayer(k, v, room) for k, v in zip(keys, values, strict=True)])


def filled_layers(cache: Cache) -> tuple[list[Tensor], list[Tensor]]:
    """Each layer's keys and values of a cache a forward has filled (every layer an attention layer's)."""
    keys, values = [], []
    for index, layer in enumerate(cache.layers):
        if not isinstance(layer, CacheLayerMixin) or layer.keys is None or layer.values is None:
            raise TypeError(f"cache layer {index} ({type(layer).__name__}) holds no keys and values")
        keys.append(layer.keys)
        values.append(layer.values)
    return keys, values


def as_growing(cache: Cache, room: int = MIN_ROOM) -> Cache:
    """The same keys and values as `cache` (e.g. one a prefill filled), in a cache that grows in place."""
    keys, values = filled_layers(cache)
    return growing_cache([[k] for k in keys], [[v] for v in values], room)
