"""The EAGLE-3 draft model: one Llama decoder layer over [token embedding; fused target hidden state].

It computes what SGLang's `llama_eagle3` computes on the exported checkpoint, so the module that trains is
the module that serves. Submodule and buffer names are the checkpoint's names (see export.py); only the
frozen `embed_tokens`, taken from the target, is not exported.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from eaglepipe.drafter import DrafterError
from eaglepipe.target.architecture import TargetArchitecture, TargetConfigError


@dataclass(frozen=True)
class Eagle3Config:
    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    vocab_size: int
    draft_vocab_size: int
    target_hidden_size: int
    aux_layer_ids: tuple[int, ...]
    torch_dtype: str = "float32"

    @classmethod
    def from_target(
        cls,
        target: TargetArchitecture,
        draft_vocab_size: int,
        aux_layer_ids: list[int],
        torch_dtype: str = "float32",
    ) -> Eagle3Config:
        """The draft layer mirrors the target's geometry so it can share the target's embedding: its
        hidden size, heads and head width (MLA's value head on DeepSeek/Kimi: 64 heads of 128 on
        Kimi-K2.5, as the public Kimi drafters), MLP width and rotary base.

        `draft_vocab_size` is capped at the target vocabulary; `aux_layer_ids` follow the "output of
        layer i" convention of the hidden-state manifests (HF `hidden_states[i + 1]`).
        """
        if draft_vocab_size < 1:
            raise DrafterError(f"draft_vocab_size is {draft_vocab_size}: it must be at least 1")
        aux = tuple(aux_layer_ids)
        if len(aux) != 3 or not all(0 <= i < target.num_layers for i in aux):
            raise DrafterError(
                f"aux_layer_ids {list(aux)} must be three layer ids in 0..{target.num_layers - 1}"
            )
        try:
            return cls(
                hidden_size=target.hidden_size,
                intermediate_size=target.intermediate_size,
                num_attention_heads=target.num_attention_heads,
                num_key_value_heads=target.num_key_value_heads,
                head_dim=target.attention_head_dim,
                rms_norm_eps=target.rms_norm_eps,
                rope_theta=target.rope_theta,
                max_position_embeddings=target.max_position_embeddings,
                vocab_size=target.vocab_size,
                draft_vocab_size=min(draft_vocab_size, target.vocab_size),
                target_hidden_size=target.hidden_size,
                aux_layer_ids=aux,
                torch_dtype=torch_dtype,
            )
        except TargetConfigError as err:
            raise DrafterError(str(err)) from None


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        wide = x.float()
        normed = wide * torch.rsqrt(wide.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * normed.to(x.dtype)


def rope_cos_sin(positions: Tensor, head_dim: int, theta: float, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, device=positions.device).float() / head_dim)
    angles = positions.float()[:, None] * inv_freq[None, :]
    angles = torch.cat((angles, angles), dim=-1)
    return angles.cos().to(dtype), angles.sin().to(dtype)


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


@dataclass
class DraftCache:
    """Keys and values the draft layer attends to.

    The context holds one entry per position, computed on the first step from the target's hidden states.
    A chain holds, for each later step, one entry per query row: that row's own earlier drafts. A row
    sees the context up to its anchor position plus its own chain: the attention SGLang runs for a top-1
    draft chain, and SpecForge's training-time test when every position is a row. Extending the context
    starts new chains.
    """

    keys: Tensor | None = None
    values: Tensor | None = None
    chain_keys: list[Tensor] = field(default_factory=list)
    chain_values: list[Tensor] = field(default_factory=list)

    @property
    def length(self) -> int:
        return 0 if self.keys is None else self.keys.shape[2]

    def context(self) -> tuple[Tensor, Tensor]:
        """The context's keys and values, once a context step has filled them."""
        if self.keys is None or self.values is None:
            raise ValueError("the draft cache has no context yet: the first step must extend the context")
        return self.keys, self.values

    def extend_context(self, keys: Tensor, values: Tensor) -> None:
        self.chain_keys, self.chain_values = [], []
        self.keys = keys if self.keys is None else torch.cat((self.keys, keys), dim=2)
        self.values = values if self.values is None else torch.cat((self.values, values), dim=2)

    def extend_chains(self, keys: Tensor, values: Tensor) -> None:
        if keys.shape[2] > self.length or (self.chain_keys and self.chain_keys[0].shape != keys.shape):
            raise ValueError("a chain step must continue the same last rows of the context")
        self.chain_keys.append(keys)
        self.chain_values.append(values)


@dataclass
class PackedRows:
    """Independent sequences packed along the row dimension, each with its own cache and row count.

    The linear layers see one tensor, so one read of the weights serves every sequence: a draft step for
    many prompts costs about what it costs for one while it is memory-bound. Only attention is per sequence.
    """

    caches: list[DraftCache]
    sizes: list[int]


def self_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    cos: Tensor,
    sin: Tensor,
    packed: PackedRows,
    context_step: bool,
    head_dim: int,
) -> Tensor:
    """[B, R, heads*d] projections -> [B, R, heads*d]; shared by the split and the fused (SGLang) layout."""
    segments = zip(
        q.split(packed.sizes, 1),
        k.split(packed.sizes, 1),
        v.split(packed.sizes, 1),
        cos.split(packed.sizes),
        sin.split(packed.sizes),
        packed.caches,
        strict=True,
    )
    return torch.cat(
        [
            _attend(q_rows, k_rows, v_rows, cos_rows, sin_rows, cache, context_step, head_dim)
            for q_rows, k_rows, v_rows, cos_rows, sin_rows, cache in segments
        ],
        dim=1,
    )


def _attend(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    cos: Tensor,
    sin: Tensor,
    cache: DraftCache,
    context_step: bool,
    head_dim: int,
) -> Tensor:
    batch, rows, _ = q.shape
    q, k, v = (t.view(batch, rows, -1, head_dim).transpose(1, 2) for t in (q, k, v))
    q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
    if context_step:
        cache.extend_context(k, v)
    else:
        cache.extend_chains(k, v)
    context_keys, context_values = cache.context()
    group = q.shape[1] // k.shape[1]
    length = cache.length
    anchors = torch.arange(length - rows, length, device=q.device)
    visible = torch.arange(length, device=q.device)[None, :] <= anchors[:, None]
    scale = head_dim**-0.5
    scores = (q @ context_keys.repeat_interleave(group, 1).transpose(-1, -2)) * scale
    scores = scores.masked_fill(~visible, float("-inf"))
    if cache.chain_keys:
        chain_keys = torch.stack(cache.chain_keys, dim=3).repeat_interleave(group, 1)
        scores = torch.cat((scores, (q.unsqueeze(3) * chain_keys).sum(-1) * scale), dim=-1)
    probs = scores.float().softmax(-1).to(q.dtype)
    out = probs[..., :length] @ context_values.repeat_interleave(group, 1)
    if cache.chain_values:
        chain_values = torch.stack(cache.chain_values, dim=3).repeat_interleave(group, 1)
        out = out + (probs[..., length:].unsqueeze(-1) * chain_values).sum(3)
    return out.transpose(1, 2).reshape(batch, rows, -1)


class Attention(nn.Module):
    def __init__(self, config: Eagle3Config) -> None:
        super().__init__()
        width, d = 2 * config.hidden_size, config.head_dim
        self.head_dim = d
        self.q_proj = nn.Linear(width, config.num_attention_heads * d, bias=False)
        self.k_proj = nn.Linear(width, config.num_key_value_heads * d, bias=False)
        self.v_proj = nn.Linear(width, config.num_key_value_heads * d, bias=False)
        self.o_proj = nn.Linear(config.num_attention_heads * d, config.hidden_size, bias=False)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, packed: PackedRows, context_step: bool) -> Tensor:
        out = self_attention(
            self.q_proj(x), self.k_proj(x), self.v_proj(x), cos, sin, packed, context_step, self.head_dim
        )
        return self.o_proj(out)


class MLP(nn.Module):
    def __init__(self, config: Eagle3Config) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, config: Eagle3Config) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.hidden_norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        # The split layout here; export.load_exported swaps in SGLang's fused one (FusedAttention, FusedMLP).
        self.self_attn: nn.Module = Attention(config)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp: nn.Module = MLP(config)

    def forward(
        self, embeds: Tensor, hidden: Tensor, cos: Tensor, sin: Tensor, packed: PackedRows, context_step: bool
    ) -> Tensor:
        x = torch.cat((self.input_layernorm(embeds), self.hidden_norm(hidden)), dim=-1)
        residual = self.self_attn(x, cos, sin, packed, context_step) + hidden
        return self.mlp(self.post_attention_layernorm(residual)) + residual


class Eagle3Drafter(nn.Module):
    d2t: Tensor  # buffers (register_buffer): draft id -> target id offset, and the target ids drafted
    t2d: Tensor

    def __init__(self, config: Eagle3Config, embed_weight: Tensor) -> None:
        super().__init__()
        if tuple(embed_weight.shape) != (config.vocab_size, config.hidden_size):
            raise DrafterError(
                f"target embedding is {tuple(embed_weight.shape)}, the drafter config expects "
                f"({config.vocab_size}, {config.hidden_size}): use the drafter's own target"
            )
        self.config = config
        self.embed_tokens = nn.Embedding.from_pretrained(embed_weight, freeze=True)
        self.fc = nn.Linear(3 * config.target_hidden_size, config.hidden_size, bias=False)
        self.midlayer = DecoderLayer(config)
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.lm_head = nn.Linear(config.hidden_size, config.draft_vocab_size, bias=False)
        self.register_buffer("d2t", torch.zeros(config.draft_vocab_size, dtype=torch.long))
        self.register_buffer("t2d", torch.zeros(config.vocab_size, dtype=torch.bool))
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.normal_(module.weight, std=0.02)

    def set_draft_vocab(self, d2t: Tensor, t2d: Tensor) -> None:
        target_ids = torch.arange(len(d2t)) + d2t.cpu()
        if (
            d2t.shape != self.d2t.shape
            or t2d.shape != self.t2d.shape
            or not torch.equal(t2d.cpu().nonzero().flatten(), target_ids.sort().values)
        ):
            raise DrafterError("d2t and t2d do not describe one draft vocabulary of the configured sizes")
        self.d2t.copy_(d2t)
        self.t2d.copy_(t2d)

    def step(self, input_ids: Tensor, hidden: Tensor, cache: DraftCache) -> Tensor:
        """next_h [B, R, H] for token rows [B, R].

        `hidden` is the target's three aux states [B, R, 3H] on the first step (fused by `fc`; the rows
        extend the context) or the previous step's next_h [B, R, H] (the rows extend their chains).
        """
        return self.step_packed([input_ids], [hidden], [cache])[0]

    def step_packed(
        self, input_ids: list[Tensor], hidden: list[Tensor], caches: list[DraftCache]
    ) -> list[Tensor]:
        """`step` for independent sequences at once (all at a context step, or all at a chain step), each
        with its own cache: the sequences share every weight read."""
        sizes = [ids.shape[1] for ids in input_ids]
        context_step = hidden[0].shape[-1] != self.config.hidden_size
        device = input_ids[0].device
        if context_step:
            starts = [c.length for c in caches]
        else:
            starts = [c.length - n + len(c.chain_keys) + 1 for c, n in zip(caches, sizes, strict=True)]
        positions = torch.cat(
            [torch.arange(start, start + n, device=device) for start, n in zip(starts, sizes, strict=True)]
        )
        packed_hidden = torch.cat(hidden, dim=1)
        if context_step:
            packed_hidden = self.fc(packed_hidden.to(self.fc.weight.dtype))
        cos, sin = rope_cos_sin(positions, self.config.head_dim, self.config.rope_theta, packed_hidden.dtype)
        embeds = self.embed_tokens(torch.cat(input_ids, dim=1)).to(packed_hidden.dtype)
        next_h = self.midlayer(embeds, packed_hidden, cos, sin, PackedRows(caches, sizes), context_step)
        return list(next_h.split(sizes, dim=1))

    def logits(self, next_h: Tensor) -> Tensor:
        """Over the draft vocabulary; `draft_to_target` maps an argmax back to a target id."""
        return self.lm_head(self.norm(next_h))

    def forward(self, input_ids: Tensor, hidden: Tensor, cache: DraftCache) -> tuple[Tensor, Tensor]:
        next_h = self.step(input_ids, hidden, cache)
        return self.logits(next_h), next_h

    def draft_to_target(self, draft_ids: Tensor) -> Tensor:
        return draft_ids + self.d2t[draft_ids]
