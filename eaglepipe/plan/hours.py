"""The plan's time: generation wall time at the run's concurrency, and the GPU hours of the hidden-state and
training stages from the model's size and the token counts. Each figure is a rate times a count, and the
plan prints the rate with the config key that sets it: these are orders of magnitude, not promises.

Compute: a forward pass costs 2 FLOPs per active parameter per token, training 6 (forward and backward);
attention's quadratic term is left out (a few percent at a few thousand tokens per sample).
"""

from __future__ import annotations

from dataclasses import dataclass

from eaglepipe.config_types import Config, DrafterSection
from eaglepipe.target.architecture import TargetArchitecture, TargetConfigError


@dataclass(frozen=True)
class Hours:
    """None where the count or the model's size is unknown."""

    generation_s: float | None
    tokens_per_s_per_request: float
    concurrency: int
    hidden_gpu_h: float | None
    # Loading the target's weights, once per hidden-state job (one per set); None before they are there.
    load_s_per_job: float | None
    load_gb_per_s: float
    train_gpu_h: float | None
    hidden_gpus: int
    train_gpus: int
    gpu_tflops: float
    active_parameters: int | None
    active_parameters_source: str
    drafter_parameters: int | None
    # A stage on the CPU (the demo) has no GPU hours to plan.
    hidden_on_cpu: bool = False
    train_on_cpu: bool = False


def plan_hours(
    config: Config,
    architecture: TargetArchitecture | None,
    geometry_source: str,
    weights_bytes: int | None,
    output_tokens: int | None,
    hidden_tokens: int | None,
    train_tokens: int | None,
) -> Hours:
    """`architecture`: the target's shapes, from `geometry_source`; `weights_bytes`: the target's
    checkpoint on disk, None before it is downloaded; `output_tokens`: what generation still
    buys through OpenRouter; `hidden_tokens`: what the hidden stage still reads; `train_tokens`: what
    training reads, every set's."""
    plan = config["plan"]
    rate, concurrency = plan["tokens_per_s_per_request"], config["generation"]["concurrency"]
    generation_s = None if output_tokens is None else output_tokens / (rate * concurrency)
    active, source, drafter = None, "", None
    if architecture is not None:
        try:
            active, source = active_parameters(architecture), geometry_source
            drafter = drafter_parameters(architecture, config["drafter"])
        except (TargetConfigError, KeyError, TypeError, ValueError):  # a config.json the plan cannot size
            active, source, drafter = None, "", None
    if active is None and config["target"].get("active_parameters"):
        active, source = int(config["target"]["active_parameters"]), "target.active_parameters"
    flops_per_s = plan["gpu_tflops"] * 1e12
    hidden_gpu_h = train_gpu_h = None
    if hidden_tokens is not None and active is not None:
        hidden_gpu_h = hidden_tokens * 2 * active / flops_per_s / 3600
    if train_tokens is not None and drafter is not None and architecture is not None:
        per_token = training_flops_per_token(architecture, drafter, config["drafter"]["ttt_length"])
        train_gpu_h = train_tokens * config["drafter"]["epochs"] * per_token / flops_per_s / 3600
    return Hours(
        generation_s=generation_s,
        tokens_per_s_per_request=rate,
        concurrency=concurrency,
        hidden_gpu_h=hidden_gpu_h,
        load_s_per_job=None if weights_bytes is None else weights_bytes / (plan["load_gb_per_s"] * 1e9),
        load_gb_per_s=plan["load_gb_per_s"],
        train_gpu_h=train_gpu_h,
        hidden_gpus=max(config["hidden"]["gpus"], 1),
        train_gpus=max(config["drafter"]["gpus"], 1),
        gpu_tflops=plan["gpu_tflops"],
        active_parameters=active,
        active_parameters_source=source,
        drafter_parameters=drafter,
        hidden_on_cpu=config["hidden"].get("device") == "cpu",
        train_on_cpu=config["drafter"].get("device") == "cpu",
    )


def active_parameters(target: TargetArchitecture) -> int:
    """The weights one token passes through: every layer's attention, the dense MLPs, the routed experts a
    token is sent to plus the shared ones (DeepSeek-V3 / Kimi-K2.5 MoE), and the LM head."""
    text, hidden, layers = target.text, target.hidden_size, target.num_layers
    attention = _attention_parameters(target)
    experts = text.get("n_routed_experts")
    dense_mlp = 3 * hidden * target.intermediate_size
    if experts:
        dense_layers = min(int(text.get("first_k_dense_replace") or 0), layers)
        per_token_experts = int(text.get("num_experts_per_tok") or 1) + int(text.get("n_shared_experts") or 0)
        moe_mlp = 3 * hidden * int(text["moe_intermediate_size"]) * per_token_experts + hidden * int(experts)
        mlp = dense_layers * dense_mlp + (layers - dense_layers) * moe_mlp
    else:
        mlp = layers * dense_mlp
    return layers * attention + mlp + hidden * target.vocab_size


def _attention_parameters(target: TargetArchitecture) -> int:
    text, hidden, heads = target.text, target.hidden_size, target.num_attention_heads
    if target.uses_mla:
        nope, rope = int(text["qk_nope_head_dim"]), int(text["qk_rope_head_dim"])
        value, kv_rank = int(text["v_head_dim"]), text["kv_lora_rank"]
        assert kv_rank is not None  # what `uses_mla` checks
        q_rank = text.get("q_lora_rank")
        head_width = heads * (nope + rope)
        query = hidden * int(q_rank) + int(q_rank) * head_width if q_rank else hidden * head_width
        key_value = hidden * (kv_rank + rope) + kv_rank * heads * (nope + value)
        return query + key_value + heads * value * hidden
    head_dim = target.attention_head_dim
    return 2 * hidden * heads * head_dim + 2 * hidden * target.num_key_value_heads * head_dim


def drafter_parameters(target: TargetArchitecture, drafter: DrafterSection) -> int:
    """The EAGLE-3 draft layer as eaglepipe.drafter.model builds it: the fc over the three auxiliary
    states, one decoder layer reading 2H (embedding and state), and the LM head over the draft vocabulary."""
    hidden, heads, kv_heads = target.hidden_size, target.num_attention_heads, target.num_key_value_heads
    head_dim = target.attention_head_dim
    attention = 2 * hidden * (heads + 2 * kv_heads) * head_dim + heads * head_dim * hidden
    mlp = 3 * hidden * target.intermediate_size
    head = hidden * min(drafter["draft_vocab_size"], target.vocab_size)
    return 3 * hidden * hidden + attention + mlp + head


def training_flops_per_token(target: TargetArchitecture, drafter: int, ttt_length: int) -> float:
    """Forward and backward through the draft layer once per test-time-training step, and the target's
    LM head once (forward only) for the distribution the draft learns."""
    return 6 * drafter * ttt_length + 2 * target.hidden_size * target.vocab_size
