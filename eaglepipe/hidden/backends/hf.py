"""transformers in process: CPU, one GPU, or a small target spread over a node (`device: auto`).

Aux layers are taken by forward hooks on the decoder layers (their outputs, our convention); the final
state is the decoder's output, after its final norm. The lm_head never runs: its full-vocabulary logits
would cost more memory than every state kept (163,840 wide for Kimi-K2.5).
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import Tensor

from eaglepipe.hidden import HiddenError
from eaglepipe.hidden.backends import BackendSettings, CapturedStates
from eaglepipe.target.load import load_target


class HFBackend:
    def __init__(self, settings: BackendSettings, target_dir: Path, aux_layers: list[int]) -> None:
        self.settings = settings
        self.aux_layers = aux_layers
        self.target_dir = target_dir
        self._decoder: torch.nn.Module | None = None

    @property
    def decoder(self) -> torch.nn.Module:
        if self._decoder is None:  # loaded on first use: a job whose shards all exist never loads it
            model = load_target(self.target_dir, self.settings.compute_dtype, self.settings.device)
            self._decoder = decoder_of(model)
        return self._decoder

    def states(self, samples: list[Tensor]) -> list[CapturedStates]:
        """Whole samples, batched by padded token count (`batch_tokens`), shortest first so that a batch
        pads its samples to lengths close to their own; returned in the order given."""
        order = sorted(range(len(samples)), key=lambda i: len(samples[i]))
        captured: dict[int, CapturedStates] = {}
        batch: list[int] = []
        for index in order:
            width = len(samples[index])  # the longest yet: the batch's padded width
            if batch and width * (len(batch) + 1) > self.settings.batch_tokens:
                captured.update(zip(batch, self._forward([samples[i] for i in batch]), strict=True))
                batch = []
            batch.append(index)
        if batch:
            captured.update(zip(batch, self._forward([samples[i] for i in batch]), strict=True))
        return [captured[i] for i in range(len(samples))]

    @torch.no_grad()
    def _forward(self, batch: list[Tensor]) -> list[CapturedStates]:
        decoder = self.decoder
        device = next(decoder.parameters()).device
        width = max(len(ids) for ids in batch)
        ids = torch.zeros(len(batch), width, dtype=torch.long)
        mask = torch.zeros(len(batch), width, dtype=torch.long)
        for i, sample in enumerate(batch):
            ids[i, : len(sample)], mask[i, : len(sample)] = sample.long(), 1
        aux, final = capture_states(decoder, self.aux_layers, ids.to(device), mask.to(device))
        return [
            CapturedStates(ids[i, : len(sample)], aux[i, : len(sample)].cpu(), final[i, : len(sample)].cpu())
            for i, sample in enumerate(batch)
        ]


def decoder_of(model: torch.nn.Module) -> torch.nn.Module:
    """The transformer stack (its `layers` and final `norm`), without the lm_head."""
    for module in model.modules():
        if isinstance(getattr(module, "layers", None), torch.nn.ModuleList) and hasattr(module, "norm"):
            return module
    raise HiddenError(f"{type(model).__name__}: no decoder with `layers` and `norm` to capture states from")


@torch.no_grad()
def capture_states(
    decoder: torch.nn.Module, layers: list[int], input_ids: Tensor, attention_mask: Tensor
) -> tuple[Tensor, Tensor]:
    """(aux [B, L, 3H], final [B, L, H]). Hooks keep only these layers, where `output_hidden_states`
    would hold all of them."""
    captured: dict[int, Tensor] = {}

    def keep(index: int):
        def hook(_module, _inputs, output):
            captured[index] = output[0] if isinstance(output, tuple) else output

        return hook

    handles = [decoder.get_submodule(f"layers.{i}").register_forward_hook(keep(i)) for i in layers]
    try:
        out = decoder(input_ids=input_ids, attention_mask=attention_mask, use_cache=False)
    finally:
        for handle in handles:
            handle.remove()
    return torch.cat([captured[i] for i in layers], dim=-1), out.last_hidden_state
