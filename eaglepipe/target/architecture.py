"""The target's config.json, read once for every stage: where the architecture-specific facts live.

Kimi-K2.5 nests its DeepSeek-V3 language model under `text_config` and its weights under `language_model.`;
DeepSeek-V3-family targets (MLA) use `head_dim` for the rope head dim, not the attention head size; the
serving engines read some DeepSeek keys with defaults other than what transformers computes. Each of those
is answered here, so the hidden stage, the drafter, its export and the spend plan read the same target.
Torch-free: the spend plan imports it at parse time.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, TypedDict

from eaglepipe.errors import EaglepipeError

# Checkpoints that hold a language model beside other towers, and where its weights live in them.
NESTED_TEXT_WEIGHTS = {"kimi_k25": "language_model."}
DEEPSEEK_FAMILY = frozenset({"deepseek_v2", "deepseek_v3", "kimi_k2"})


# Published config.json files of targets, by hub name (`published/ORG/NAME/config.json`).
PUBLISHED = Path(__file__).resolve().parent / "published"


def published_config_dir(name: str) -> Path:
    """Where the package keeps the published config.json of the target named `name` (a hub id): the spend
    plan sizes the drafter, the shards and the GPU hours from it before the target is downloaded. Add one
    for another target as `published/ORG/NAME/config.json`."""
    return PUBLISHED / name


class RopeParameters(TypedDict, total=False):
    rope_theta: float


class ModelConfig(TypedDict, total=False):
    """The keys of a target's config.json (or its `text_config`) that the stages read; a checkpoint holds
    many more, which nothing here looks at. Token ids may be a list (the first counts)."""

    architectures: list[str]
    model_type: str
    text_config: ModelConfig
    num_hidden_layers: int
    hidden_size: int
    vocab_size: int
    num_attention_heads: int
    num_key_value_heads: int | None
    intermediate_size: int
    rms_norm_eps: float
    max_position_embeddings: int
    rope_parameters: RopeParameters | None
    rope_theta: float
    kv_lora_rank: int | None  # set for multi-head latent attention (MLA), with the next three
    v_head_dim: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    head_dim: int | None
    bos_token_id: int | list[int] | None
    eos_token_id: int | list[int] | None
    pad_token_id: int | list[int] | None
    tie_word_embeddings: bool
    # DeepSeek's keys the engines read with defaults of their own (`engine_problems`).
    scoring_func: str
    topk_method: str
    n_group: int
    topk_group: int
    routed_scaling_factor: float
    first_k_dense_replace: int
    norm_topk_prob: bool
    n_shared_experts: int
    q_lora_rank: int | None
    moe_layer_freq: int
    attention_bias: bool
    hidden_act: str
    index_topk: int
    # DeepSeek's mixture of experts (the spend plan counts its active weights).
    n_routed_experts: int | None
    num_experts_per_tok: int
    moe_intermediate_size: int


# The keys without which a stage cannot size the model.
NeededKey = Literal[
    "num_hidden_layers",
    "hidden_size",
    "vocab_size",
    "num_attention_heads",
    "intermediate_size",
    "max_position_embeddings",
    "v_head_dim",
]
TokenKey = Literal["bos_token_id", "eos_token_id", "pad_token_id"]


class TargetConfigError(EaglepipeError, ValueError):
    """A target config.json a stage cannot use as it is: one line naming the file and key."""


def _read(path: Path) -> ModelConfig:
    try:
        config: ModelConfig = json.loads(path.read_text())  # checked below: an object
    except (OSError, json.JSONDecodeError) as err:
        raise TargetConfigError(
            f"{path}: cannot read the target config ({err}): is target.path a model directory?"
        ) from None
    if not isinstance(config, dict):
        raise TargetConfigError(f"{path}: not a JSON object: is target.path a model directory?")
    return config


@dataclass(frozen=True)
class TargetArchitecture:
    """The language model's settings (`text`), and how the checkpoint around it is laid out."""

    config: ModelConfig
    source: str  # the file it came from, for messages

    @classmethod
    def from_dir(cls, target_dir: str | Path) -> TargetArchitecture:
        path = Path(target_dir) / "config.json"
        return cls(_read(path), str(path))

    @classmethod
    def from_config(cls, config: ModelConfig, source: str = "config.json") -> TargetArchitecture:
        return cls(config.copy(), source)

    @property
    def nested(self) -> bool:
        return isinstance(self.config.get("text_config"), dict)

    @property
    def text(self) -> ModelConfig:
        return self.config["text_config"] if self.nested else self.config

    @property
    def architecture(self) -> str:
        return (self.config.get("architectures") or [""])[0]

    @property
    def model_type(self) -> str:
        return str(self.config.get("model_type", ""))

    @property
    def text_model_type(self) -> str:
        return str(self.text.get("model_type", self.model_type))

    def need(self, key: NeededKey) -> int:
        value = self.text.get(key)
        if value is None:
            where = f"text_config.{key}" if self.nested else key
            raise TargetConfigError(f"{self.source}: no {where!r}: point target.path at a causal LM's files")
        return value

    @property
    def num_layers(self) -> int:
        return int(self.need("num_hidden_layers"))

    @property
    def hidden_size(self) -> int:
        return int(self.need("hidden_size"))

    @property
    def vocab_size(self) -> int:
        return int(self.need("vocab_size"))

    @property
    def num_attention_heads(self) -> int:
        return int(self.need("num_attention_heads"))

    @property
    def num_key_value_heads(self) -> int:
        return int(self.text.get("num_key_value_heads") or self.num_attention_heads)

    @property
    def intermediate_size(self) -> int:
        return int(self.need("intermediate_size"))

    @property
    def rms_norm_eps(self) -> float:
        return float(self.text.get("rms_norm_eps", 1e-6))

    @property
    def max_position_embeddings(self) -> int:
        return int(self.need("max_position_embeddings"))

    @property
    def rope_theta(self) -> float:
        """The rotary base, as transformers v5 (`rope_parameters`) or the checkpoint (`rope_theta`) says."""
        parameters = self.text.get("rope_parameters") or {}
        return float(parameters.get("rope_theta", self.text.get("rope_theta", 10_000.0)))

    @property
    def uses_mla(self) -> bool:
        """Multi-head latent attention (DeepSeek-V2/V3, Kimi-K2.5): keys and values from a LoRA rank."""
        return self.text.get("kv_lora_rank") is not None

    @property
    def attention_head_dim(self) -> int:
        """One attention head's width: MLA's value head (DeepSeek's `head_dim` key is its rope dim: 64 on
        Kimi-K2.5, where heads are 128 wide); else `head_dim`, else hidden / heads."""
        if self.uses_mla:
            return int(self.need("v_head_dim"))
        return int(self.text.get("head_dim") or self.hidden_size // self.num_attention_heads)

    def _token_id(self, key: TokenKey) -> int | None:
        value = self.text.get(key, self.config.get(key))
        if isinstance(value, list):
            value = value[0] if value else None
        return None if value is None else int(value)

    @property
    def bos_token_id(self) -> int | None:
        return self._token_id("bos_token_id")

    @property
    def eos_token_id(self) -> int | None:
        return self._token_id("eos_token_id")

    @property
    def pad_token_id(self) -> int | None:
        return self._token_id("pad_token_id")

    @property
    def tie_word_embeddings(self) -> bool:
        """Whether the lm_head is the embedding. DeepSeek's engines never tie, whatever the key says."""
        if self.text_model_type in DEEPSEEK_FAMILY:
            return False
        return bool(self.text.get("tie_word_embeddings", self.config.get("tie_word_embeddings", False)))

    @property
    def weight_prefix(self) -> str:
        """Where the language model's tensors sit in the checkpoint (`language_model.` for Kimi-K2.5)."""
        return NESTED_TEXT_WEIGHTS.get(self.model_type, "") if self.nested else ""

    @property
    def embedding_weight(self) -> str:
        return f"{self.weight_prefix}model.embed_tokens.weight"

    @property
    def lm_head_weight(self) -> str:
        return f"{self.weight_prefix}lm_head.weight"

    @property
    def final_norm_weight(self) -> str:
        return f"{self.weight_prefix}model.norm.weight"

    @property
    def text_only(self) -> bool:
        """Towers beside the language model (Kimi-K2.5's vision): engines build the text model alone."""
        return self.nested

    def engine_problems(self) -> list[str]:
        """Keys the serving engines (vLLM, SGLang) read with another default than what transformers
        computes, missing or set otherwise: each makes the engines run another model than the `hf` backend
        and the drafter's training assume (mostly without an error), or refuse the checkpoint at load.
        Empty when they agree."""
        if self.text_model_type not in DEEPSEEK_FAMILY:
            return []
        where = "text_config." if self.nested else ""
        text = self.text
        problems = []
        # transformers' DeepSeek-V3 always routes with sigmoid scores, a correction bias and group top-k.
        # What vLLM does instead (its deepseek_v2.py): it scores with softmax, silently; and it builds the
        # correction bias only for noaux_tc, so the bias the checkpoint holds stops its weight loading.
        expected = {"scoring_func": "sigmoid", "topk_method": "noaux_tc"}
        engine_instead = {
            "scoring_func": "vLLM then scores the experts with softmax, without an error,",
            "topk_method": "vLLM then builds no correction bias and fails loading the checkpoint's "
            "(KeyError: '...mlp.gate.e_score_correction_bias'),",
        }
        for key, value in expected.items():
            if text.get(key) != value:
                problems.append(
                    f"{where}{key} is {text.get(key)!r}: {engine_instead[key]} where transformers uses "
                    f'{value!r}; set "{key}": "{value}" (DeepSeek-V3 and Kimi-K2.5 ship it)'
                )
        # Keys transformers fills with its own defaults when absent, and vLLM with others.
        for key in (
            "n_group",
            "topk_group",
            "routed_scaling_factor",
            "first_k_dense_replace",
            "norm_topk_prob",
            "n_shared_experts",
            "q_lora_rank",
        ):
            if key not in text:
                problems.append(
                    f"{where}{key} is missing: transformers and vLLM default it differently; write it"
                )
        if text.get("moe_layer_freq", 1) != 1:
            problems.append(
                f"{where}moe_layer_freq is {text['moe_layer_freq']!r}: transformers ignores it; use 1"
            )
        if text.get("attention_bias"):
            problems.append(f"{where}attention_bias is true: vLLM's DeepSeek has no attention bias")
        if text.get("hidden_act", "silu") != "silu":
            problems.append(f"{where}hidden_act is {text['hidden_act']!r}: vLLM's DeepSeek runs silu only")
        if "index_topk" in text:
            problems.append(f"{where}index_topk is set: that is DeepSeek-V3.2's sparse attention, not V3's")
        return problems

    def check_engines_agree(self) -> None:
        """`engine_problems` as one line, for the stages that hand the target to an engine."""
        problems = self.engine_problems()
        if problems:
            raise TargetConfigError(
                f"{self.source}: the engines would compute another model than transformers: "
                + "; ".join(problems)
            )


def main(argv: list[str] | None = None) -> int:
    """`python -m eaglepipe.target.architecture DIR`: what the stages read of a target, and whether the
    engines and transformers compute the same model from it."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m eaglepipe.target.architecture TARGET_DIR", file=sys.stderr)
        return 2
    try:
        target = TargetArchitecture.from_dir(args[0])
        summary = {
            "architecture": target.architecture,
            "text_model_type": target.text_model_type,
            "nested": target.nested,
            "weight_prefix": target.weight_prefix,
            "num_layers": target.num_layers,
            "hidden_size": target.hidden_size,
            "attention_head_dim": target.attention_head_dim,
            "vocab_size": target.vocab_size,
            "uses_mla": target.uses_mla,
        }
        print(json.dumps(summary, indent=1))
        target.check_engines_agree()
    except TargetConfigError as err:
        print(f"eaglepipe: {err}", file=sys.stderr)
        return 1
    print("the engines and transformers read this target alike")
    return 0


if __name__ == "__main__":
    sys.exit(main())
