"""Batched generation by the local model, in one worker thread beside the event loop.

Requests that wait while the model is busy are run together as one left-padded batch with a KV cache,
so a client with hundreds of requests in flight sees the throughput a real provider gives, and the
event loop keeps answering (and streaming) while the model computes.

Greedy output of a batched request equals the same request alone up to float32 rounding: the batch's
matrix shapes differ, which moves logits by about 1e-4 (measured on SmolLM2-135M), so the argmax can
flip only where the top two logits are closer than that. Tests pin the text for their prompts and the
logprobs to that tolerance.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import random
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import torch

from eaglepipe.emulator.backend import GeneratedToken, GenerationFailed, GenerationRequest
from eaglepipe.target.kv_cache import as_growing

log = logging.getLogger(__name__)


_END = object()
MAX_RESERVED_SLOTS = 1024


@dataclass(eq=False)
class _Job:
    request: GenerationRequest
    loop: asyncio.AbstractEventLoop
    events: asyncio.Queue = field(default_factory=asyncio.Queue)
    cancelled: bool = False
    generator: torch.Generator | None = None

    def emit(self, item: object) -> None:
        try:
            self.loop.call_soon_threadsafe(self.events.put_nowait, item)
        except RuntimeError:  # the event loop has closed: nobody is listening any more
            self.cancelled = True


class Engine:
    """Owns the model; `stream` is the only way in, from any coroutine on one event loop.

    It ignores `GenerationRequest.event_tokens`: tokens leave as soon as the model makes them.
    """

    cancellable = True  # a client that goes away frees its row; it is billed for what it received

    def __init__(
        self, model: Any, stop_id: int, pad_id: int | None, *, max_batch: int = 16, gather_s: float = 0.005
    ) -> None:
        self.model = model
        self.stop_id = stop_id
        self.pad_id = pad_id if pad_id is not None else stop_id
        self.max_batch = max_batch
        self.gather_s = gather_s
        self.batches = 0
        self.sequences = 0
        self.largest_batch = 0
        self._closing = False
        self._queue: queue.Queue[_Job | None] = queue.Queue()
        self._thread = threading.Thread(target=self._serve, name="emulator-engine", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def close(self, timeout_s: float = 5.0) -> None:
        """Stop the worker; the batch in progress ends at its next step."""
        self._closing = True
        self._queue.put(None)
        self._thread.join(timeout_s)

    async def stream(self, request: GenerationRequest) -> AsyncIterator[GeneratedToken]:
        """The completion's tokens as they are generated, the stop token included when produced."""
        if self._closing:
            raise GenerationFailed("the emulator is shutting down")
        job = _Job(request, asyncio.get_running_loop())
        self._queue.put(job)
        try:
            while True:
                item = await job.events.get()
                if item is _END:
                    return
                if isinstance(item, BaseException):
                    raise GenerationFailed(f"generation failed: {item}") from item
                yield item
        finally:
            job.cancelled = True  # a client that went away frees its row at the next step

    def _serve(self) -> None:
        while not self._closing:
            first = self._queue.get()
            if first is None:
                return
            jobs = [first]
            deadline = time.monotonic() + self.gather_s
            while len(jobs) < self.max_batch:
                try:
                    job = self._queue.get(timeout=max(0.0, deadline - time.monotonic()))
                except queue.Empty:
                    break
                if job is None:
                    break
                jobs.append(job)
            jobs = [job for job in jobs if not job.cancelled]
            if not jobs:
                continue
            self.batches += 1
            self.sequences += len(jobs)
            self.largest_batch = max(self.largest_batch, len(jobs))
            try:
                with torch.inference_mode():
                    self._run_batch(jobs)
            except Exception as exc:
                if not self._closing:
                    log.exception("batch of %d failed", len(jobs))
                for job in jobs:
                    job.emit(exc)

    def _run_batch(self, jobs: list[_Job]) -> None:
        for job in jobs:
            if job.request.temperature > 0:
                seed = job.request.seed if job.request.seed is not None else random.getrandbits(63)
                job.generator = torch.Generator().manual_seed(seed)
        prompts = [job.request.prompt_ids for job in jobs]
        width = max(len(ids) for ids in prompts)
        input_ids = torch.full((len(jobs), width), self.pad_id, dtype=torch.long)
        attention_mask = torch.zeros((len(jobs), width), dtype=torch.long)
        for row, ids in enumerate(prompts):
            input_ids[row, width - len(ids) :] = torch.tensor(ids, dtype=torch.long)
            attention_mask[row, width - len(ids) :] = 1
        positions = (attention_mask.cumsum(-1) - 1).clamp(min=0)
        out = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=positions,
            use_cache=True,
            logits_to_keep=1,
        )
        # Room for the longest answer asked (up to a bound, past which it doubles): steps do not copy it.
        room = min(max(job.request.max_tokens for job in jobs), MAX_RESERVED_SLOTS)
        cache, logits = as_growing(out.cache, room), out.logits[:, -1, :]
        next_positions = positions[:, -1:] + 1
        produced = [0] * len(jobs)
        while True:
            if self._closing:
                raise GenerationFailed("the emulator is shutting down")
            tokens = self._next_tokens(logits, jobs)
            keep = []
            for row, job in enumerate(jobs):
                if job.cancelled:
                    continue
                token_id = int(tokens[row])
                job.emit(self._generated(logits[row], token_id, job.request.top_logprobs))
                produced[row] += 1
                if token_id == self.stop_id or produced[row] >= job.request.max_tokens:
                    job.emit(_END)
                else:
                    keep.append(row)
            if not keep:
                return
            if len(keep) < len(jobs):
                index = torch.tensor(keep, dtype=torch.long)
                cache.batch_select_indices(index)
                jobs = [jobs[r] for r in keep]
                produced = [produced[r] for r in keep]
                tokens, attention_mask, next_positions = (
                    tokens[index],
                    attention_mask[index],
                    next_positions[index],
                )
            attention_mask = torch.cat([attention_mask, attention_mask.new_ones((len(jobs), 1))], dim=1)
            out = self.model(
                input_ids=tokens[:, None],
                attention_mask=attention_mask,
                position_ids=next_positions,
                cache=cache,
                use_cache=True,
            )
            cache, logits = out.cache, out.logits[:, -1, :]
            next_positions = next_positions + 1

    @staticmethod
    def _next_tokens(logits: torch.Tensor, jobs: list[_Job]) -> torch.Tensor:
        tokens = logits.argmax(dim=-1)
        for row, job in enumerate(jobs):
            if job.generator is not None:
                tokens[row] = _sample(logits[row], job.request.temperature, job.request.top_p, job.generator)
        return tokens

    @staticmethod
    def _generated(logits: torch.Tensor, token_id: int, top_logprobs: int | None) -> GeneratedToken:
        if top_logprobs is None:
            return GeneratedToken(token_id)
        logprobs = torch.log_softmax(logits.float(), dim=-1)
        top: tuple[tuple[int, float], ...] = ()
        if top_logprobs > 0:
            values, ids = logprobs.topk(top_logprobs)
            top = tuple(zip(ids.tolist(), values.tolist(), strict=True))
        return GeneratedToken(token_id, float(logprobs[token_id]), top)


def _sample(logits: torch.Tensor, temperature: float, top_p: float, generator: torch.Generator) -> int:
    probs = torch.softmax(logits.float() / temperature, dim=-1)
    if top_p < 1.0:
        sorted_probs, order = probs.sort(descending=True)
        outside = sorted_probs.cumsum(-1) - sorted_probs > top_p  # keep the smallest set reaching top_p
        sorted_probs[outside] = 0.0
        probs = torch.zeros_like(probs).scatter_(0, order, sorted_probs)
    return int(torch.multinomial(probs, 1, generator=generator))
