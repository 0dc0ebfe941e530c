"""Toy-sized targets of the real run's architecture, built here from seeded weights, nothing downloaded.

`kimi-k25-tiny` is Kimi-K2.5 as Moonshot ships it, at toy size: `KimiK25ForConditionalGeneration` with a
DeepSeek-V3 text model under `text_config` (MLA with q/kv LoRA ranks and split rope/nope head dims; MoE
with a dense first layer, a shared expert, sigmoid routing with a correction bias), weights under
`language_model.`, a vision config and processor file beside it (no vision weights: every engine path here
is text only), Kimi's 163,840-id vocabulary with its tokenizer files in Kimi's layout. `deepseek-v3-tiny`
is the same text model as a plain `DeepseekV3ForCausalLM`, for DeepSeek-V3-family targets.

Random weights generate noise, and noise in a 163,840-id vocabulary is mostly ids no text encodes to (the
layout's filler ranks), so the token stage could never rebuild an answer. The build therefore trains the
model briefly on teacher answers in Kimi-K2.5's structure (`reasoning </think> content [tool section]
<|im_end|>`) to the embedded demo prompts: its greedy answers carry the real markers, and are predictable
enough for a drafter to learn. Training uses only the ids the teacher text holds; every other id keeps a
zero lm_head row, so its logit is exactly 0 and the loss below is the full-vocabulary cross-entropy.
"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
import math
import os
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NotRequired, TypedDict

from eaglepipe.errors import EaglepipeError
from eaglepipe.messages import Message, Tool, ToolCall
from eaglepipe.target.chat_format import chat_format_for
from eaglepipe.target.kimi_chat import tool_history
from eaglepipe.target.kimi_layout import ensure_kimi_layout
from eaglepipe.target.kimi_tokenizer import KimiTokenizer
from eaglepipe.target.segments import encode_segments

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)

KIMI_K25_TINY = "kimi-k25-tiny"
DEEPSEEK_V3_TINY = "deepseek-v3-tiny"
TINY_TARGETS = (KIMI_K25_TINY, DEEPSEEK_V3_TINY)
# What they are taught to answer: the embedded demo prompt sets (relative to the repository).
TEACHER_FILES = tuple(
    f"resources/sources/demo/{name}.jsonl"
    for name in ("demo-chat", "demo-code", "demo-math", "demo-multiturn", "demo-tools")
)

# Kimi-K2.5's special ids (eaglepipe.target.kimi_tokenizer): [BOS], [EOS], <|im_end|>, [PAD].
BOS_ID, EOS_ID, STOP_ID, PAD_ID = 163584, 163585, 163586, 163839

class RopeScaling(TypedDict):
    type: str
    factor: float
    original_max_position_embeddings: int
    beta_fast: float
    beta_slow: float
    mscale: float
    mscale_all_dim: float


class TinyTextConfig(TypedDict):
    """The language model's config.json as written here (`ModelConfig` is what the stages read of it)."""

    architectures: NotRequired[list[str]]  # not in Kimi-K2.5's nested copy
    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    moe_intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    q_lora_rank: int
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    n_routed_experts: int
    num_experts_per_tok: int
    n_shared_experts: int
    first_k_dense_replace: int
    moe_layer_freq: int
    n_group: int
    topk_group: int
    topk_method: str
    scoring_func: str
    norm_topk_prob: bool
    routed_scaling_factor: float
    num_nextn_predict_layers: int
    hidden_act: str
    rms_norm_eps: float
    max_position_embeddings: int
    rope_theta: float
    rope_scaling: RopeScaling
    attention_bias: bool
    tie_word_embeddings: bool
    bos_token_id: int
    eos_token_id: int
    pad_token_id: int
    torch_dtype: str


class TinyVisionConfig(TypedDict):
    """What vLLM's Kimi-K2.5 class reads of the vision tower (`VISION_CONFIG`)."""

    model_type: str
    patch_size: int
    init_pos_emb_height: int
    init_pos_emb_width: int
    init_pos_emb_time: int
    pos_emb_type: str
    num_attention_heads: int
    num_hidden_layers: int
    hidden_size: int
    intermediate_size: int
    merge_kernel_size: list[int]
    video_attn_type: str
    merge_type: str
    mm_projector_type: str
    mm_hidden_size: int
    projector_hidden_act: str
    projector_ln_eps: float
    text_hidden_size: int


class MediaProcessing(TypedDict):
    in_patch_limit: int
    patch_size: int
    image_mean: list[float]
    image_std: list[float]
    merge_kernel_size: int
    fixed_output_tokens: int | None
    patch_limit_on_one_side: int
    in_patch_limit_each_frame: int
    temporal_merge_kernel_size: int
    sample_fps: int
    timestamp_mode: str


class PreprocessorConfig(TypedDict):
    media_proc_cfg: MediaProcessing


class TinyKimiConfig(TypedDict):
    """Kimi-K2.5's config.json as written here: the language model nested under `text_config`."""

    architectures: list[str]
    model_type: str
    text_config: TinyTextConfig
    vision_config: TinyVisionConfig
    media_placeholder_token_id: int
    pad_token_id: int
    tie_word_embeddings: bool
    torch_dtype: str


# The language model's config.json keys as Moonshot spells them (rope_scaling, scoring_func, ...), at toy
# size. Kept: MLA's 512 + 64 compressed width (vLLM's CPU MLA kernel takes head size 576 only), the ranks'
# and head dims' roles, the routing (sigmoid scores with a correction bias, one group), the dense first
# layer, the shared expert, YaRN rope. hidden / heads is 32, not the rope head dim (64, which transformers
# calls `head_dim` for DeepSeek), so a drafter that took that key for its own head size would show.
TEXT_CONFIG: TinyTextConfig = {
    "architectures": ["DeepseekV3ForCausalLM"],
    "model_type": "deepseek_v3",
    "vocab_size": 163_840,
    "hidden_size": 256,
    "intermediate_size": 512,
    "moe_intermediate_size": 128,
    "num_hidden_layers": 8,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "q_lora_rank": 64,
    "kv_lora_rank": 512,
    "qk_nope_head_dim": 32,
    "qk_rope_head_dim": 64,
    "v_head_dim": 32,
    "n_routed_experts": 8,
    "num_experts_per_tok": 2,
    "n_shared_experts": 1,
    "first_k_dense_replace": 1,
    "moe_layer_freq": 1,
    "n_group": 1,
    "topk_group": 1,
    "topk_method": "noaux_tc",
    "scoring_func": "sigmoid",
    "norm_topk_prob": True,
    "routed_scaling_factor": 2.827,
    "num_nextn_predict_layers": 0,
    "hidden_act": "silu",
    "rms_norm_eps": 1e-6,
    "max_position_embeddings": 262_144,
    "rope_theta": 50_000.0,
    "rope_scaling": {
        "type": "yarn",
        "factor": 64.0,
        "original_max_position_embeddings": 4096,
        "beta_fast": 1.0,
        "beta_slow": 1.0,
        "mscale": 1.0,
        "mscale_all_dim": 1.0,
    },
    "attention_bias": False,
    "tie_word_embeddings": False,
    "bos_token_id": BOS_ID,
    "eos_token_id": EOS_ID,
    "pad_token_id": PAD_ID,
    "torch_dtype": "float32",
}
# What vLLM's Kimi-K2.5 class reads of the vision tower to build its config (no weights are shipped).
VISION_CONFIG: TinyVisionConfig = {
    "model_type": "kimi_k25_vision",
    "patch_size": 14,
    "init_pos_emb_height": 4,
    "init_pos_emb_width": 4,
    "init_pos_emb_time": 4,
    "pos_emb_type": "divided_fixed",
    "num_attention_heads": 2,
    "num_hidden_layers": 1,
    "hidden_size": 64,
    "intermediate_size": 128,
    "merge_kernel_size": [2, 2],
    "video_attn_type": "spatial_temporal",
    "merge_type": "sd2_tpool",
    "mm_projector_type": "patchmerger",
    "mm_hidden_size": 64,
    "projector_hidden_act": "gelu",
    "projector_ln_eps": 1e-5,
    "text_hidden_size": TEXT_CONFIG["hidden_size"],
}
PREPROCESSOR_CONFIG: PreprocessorConfig = {
    "media_proc_cfg": {
        "in_patch_limit": 256,
        "patch_size": 14,
        "image_mean": [0.5, 0.5, 0.5],
        "image_std": [0.5, 0.5, 0.5],
        "merge_kernel_size": 2,
        "fixed_output_tokens": None,
        "patch_limit_on_one_side": 64,
        "in_patch_limit_each_frame": 256,
        "temporal_merge_kernel_size": 4,
        "sample_fps": 2,
        "timestamp_mode": "hh:mm:ss.fff",
    }
}
# The build's recipe: changing any of these changes the built files.
SEED = 0
TRAIN_STEPS = 400
BATCH_TOKENS = 768
LEARNING_RATE = 3e-3
WARMUP_STEPS = 20
ROUTER_BIAS_STD = 0.05  # a nonzero correction bias, so an engine that ignored it would compute another model
TOOL_CALL_REPEATS = 3  # tool calls are the longest answers to learn: they are seen this many times
RECIPE_VERSION = 2
STAMP = "eaglepipe-tiny-target.json"


class TinyTargetError(EaglepipeError, ValueError):
    """A tiny target that cannot be built as asked: one line."""


class TeacherConversation(TypedDict):
    """One line of a teacher-prompts file: a conversation to answer, with its tools."""

    messages: list[Message]
    tools: NotRequired[list[Tool]]


class TeacherAnswer(TypedDict):
    """The answer taught for a conversation, in Kimi's parts (`completion_segments`' keywords)."""

    reasoning: str
    content: str
    tool_calls: list[ToolCall] | None


@dataclass(frozen=True)
class TeacherSample:
    prompt_ids: list[int]
    answer_ids: list[int]  # the stop id last
    calls_tool: bool


CODE_WORDS = (
    "python",
    "function",
    "code",
    "script",
    "sql",
    "regex",
    "bash",
    "javascript",
    "program",
    "class",
)
# One answer per kind of request: what a drafter can learn from a few minutes of data, and what keeps the
# tiny target's greedy answers structured (the kind is read off the conversation, so a prompt has one).
ANSWERS = {
    "code": (
        "The user wants code.",
        "Here is a short function:\n```python\ndef solve(items):\n    return sorted(items)\n```",
    ),
    "math": ("The user asks a math question.", "Let me work it out step by step."),
    "follow_up": ("The user asks a follow-up.", "Building on my last answer: start small."),
    "chat": ("The user asks a general question.", "Here is a short answer."),
    "tool_result": ("The tool returned its result.", "Here is what I found."),
}


def request_kind(messages: list[Message]) -> str:
    if not messages:
        return "chat"
    last = messages[-1]
    if last.get("role") == "tool":
        return "tool_result"
    text = str(last.get("content") or "").lower()
    if any(word in text for word in CODE_WORDS):
        return "code"
    if re.search(r"\d", text):
        return "math"
    if sum(m.get("role") == "user" for m in messages) > 1:
        return "follow_up"
    return "chat"


def teacher_answer(messages: list[Message], tools: list[Tool] | None) -> TeacherAnswer:
    """What the tiny target is taught to answer: reasoning, content and tool calls in Kimi's structure.
    A conversation with tools gets a call to its first tool, unless it ends in that tool's result; the call
    names the tool once and passes no arguments, as copying names out of the prompt is what a model this
    small learns slowest."""
    kind = request_kind(messages)
    if tools and kind != "tool_result":
        name = tools[0]["function"]["name"]
        call: ToolCall = {
            "id": f"functions.{name}:{tool_history(messages)}",
            "type": "function",
            "function": {
                "name": name,
                "arguments": "{}",
            },
        }
        return {
            "reasoning": "I will call a tool.",
            "content": "",
            "tool_calls": [call],
        }
    reasoning, content = ANSWERS[kind]
    return {"reasoning": reasoning, "content": content, "tool_calls": None}


def teacher_samples(
    tokenizer: KimiTokenizer, conversations: list[TeacherConversation]
) -> list[TeacherSample]:
    """Each conversation rendered as a thinking turn (tools declared in TypeScript, as Kimi's template
    does), with its teacher answer."""
    chat = chat_format_for(tokenizer)
    samples = []
    for record in conversations:
        messages, tools = record["messages"], record.get("tools")
        answer = teacher_answer(messages, tools)
        segments = chat.completion_segments(**answer, truncated=False, thinking=True)
        prompt = chat.prompt_ids(messages, tools, thinking=True, tool_format="typescript")
        answer_ids = encode_segments(tokenizer, segments)
        samples.append(TeacherSample(prompt, answer_ids, calls_tool=bool(answer["tool_calls"])))
    return samples


def read_conversations(paths: list[Path]) -> list[TeacherConversation]:
    conversations: list[TeacherConversation] = []
    for path in paths:
        for number, line in enumerate(Path(path).read_text().splitlines(), 1):
            if not line.strip():
                continue
            try:
                conversations.append(json.loads(line))
            except json.JSONDecodeError as err:
                raise TinyTargetError(f"{path}:{number}: not JSON ({err}): fix the line") from None
    return conversations


def _text_model(vocab_size: int, pad_id: int) -> Any:
    """transformers' DeepSeek-V3 with the tiny config; `vocab_size` below Kimi's is the training copy, whose
    ids are positions in the kept vocabulary (so the special ids are not its own)."""
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    settings: dict[str, Any] = {  # DeepseekV3Config's keywords
        k: copy.deepcopy(v)  # transformers rewrites `rope_scaling` in place
        for k, v in TEXT_CONFIG.items()
        if k not in ("architectures", "model_type", "torch_dtype")
    }
    settings.update(vocab_size=vocab_size, pad_token_id=pad_id)
    if vocab_size != TEXT_CONFIG["vocab_size"]:
        settings.update(bos_token_id=None, eos_token_id=None)
    return DeepseekV3ForCausalLM(DeepseekV3Config(**settings))


def _batches(samples: list[TeacherSample], generator: torch.Generator) -> list[list[int]]:
    import torch

    order = torch.randperm(len(samples), generator=generator).tolist()
    batches: list[list[int]] = [[]]
    for index in order:
        length = len(samples[index].prompt_ids) + len(samples[index].answer_ids)
        width = max([length] + [len(samples[i].prompt_ids) + len(samples[i].answer_ids) for i in batches[-1]])
        if batches[-1] and width * (len(batches[-1]) + 1) > BATCH_TOKENS:
            batches.append([])
        batches[-1].append(index)
    return batches


def learning_rate(step: int) -> float:
    """Linear warm-up, then cosine decay to a tenth."""
    if step < WARMUP_STEPS:
        return LEARNING_RATE * (step + 1) / WARMUP_STEPS
    progress = (step - WARMUP_STEPS) / max(1, TRAIN_STEPS - WARMUP_STEPS)
    return LEARNING_RATE * (0.1 + 0.45 * (1 + math.cos(math.pi * progress)))


def train_on_teacher(samples: list[TeacherSample], vocab_size: int) -> dict[str, torch.Tensor]:
    """The text model's full-vocabulary state dict, trained on the teacher answers.

    It trains a copy whose vocabulary is only the ids the samples hold (`kept`), plus one column standing
    for every other id at logit 0: logsumexp over kept ids and (vocab - kept) zeros is exactly the full
    softmax's, at a fiftieth of its cost. The rows of the other ids are then a seeded embedding and a zero
    lm_head row, which keeps their logits at 0 in every engine.
    """
    import torch

    torch.manual_seed(SEED)
    generator = torch.Generator().manual_seed(SEED)
    kept = sorted({i for s in samples for i in s.prompt_ids + s.answer_ids} | {PAD_ID})
    position = {token_id: index for index, token_id in enumerate(kept)}
    model = _text_model(len(kept), position[PAD_ID])
    for name, buffer in model.named_buffers():
        if name.endswith("e_score_correction_bias"):
            buffer.copy_(torch.randn(buffer.shape, generator=generator) * ROUTER_BIAS_STD)
    others = math.log(vocab_size - len(kept))
    optimizer = torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE, betas=(0.9, 0.95), weight_decay=0.0)
    steps = 0
    model.train()
    while steps < TRAIN_STEPS:
        for batch in _batches(samples, generator):
            rows = [samples[i] for i in batch]
            width = max(len(r.prompt_ids) + len(r.answer_ids) for r in rows)
            ids = torch.full((len(rows), width), position[PAD_ID], dtype=torch.long)
            labels = torch.full((len(rows), width), -100, dtype=torch.long)
            mask = torch.zeros((len(rows), width), dtype=torch.long)
            for row, sample in enumerate(rows):
                sequence = [position[i] for i in sample.prompt_ids + sample.answer_ids]
                ids[row, : len(sequence)] = torch.tensor(sequence)
                mask[row, : len(sequence)] = 1
                start = len(sample.prompt_ids)
                labels[row, start - 1 : len(sequence) - 1] = torch.tensor(sequence[start:])
            logits = model(input_ids=ids, attention_mask=mask).logits
            logits = torch.cat([logits, logits.new_full((*logits.shape[:2], 1), others)], dim=-1)
            loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten())
            for group in optimizer.param_groups:
                group["lr"] = learning_rate(steps)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            optimizer.zero_grad()
            steps += 1
            if steps % 25 == 0 or steps == TRAIN_STEPS:
                log.info("tiny target: step %d/%d, loss %.4f", steps, TRAIN_STEPS, loss.item())
            if steps == TRAIN_STEPS:
                break
    state = {name: tensor.detach() for name, tensor in model.state_dict().items()}
    kept_ids = torch.tensor(kept)
    embed = torch.randn((vocab_size, TEXT_CONFIG["hidden_size"]), generator=generator) * 0.02
    embed[kept_ids] = state["model.embed_tokens.weight"]
    head = torch.zeros((vocab_size, TEXT_CONFIG["hidden_size"]))
    head[kept_ids] = state["lm_head.weight"]
    state["model.embed_tokens.weight"], state["lm_head.weight"] = embed, head
    return state


def _kimi_layout_names(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Moonshot's layout: the text model's tensors under `language_model.`."""
    return {f"language_model.{name}": tensor for name, tensor in state.items()}


def target_config(name: str) -> TinyTextConfig | TinyKimiConfig:
    """config.json of a tiny target, in the shape its real counterpart ships. This writes the nesting
    (`text_config` for Kimi-K2.5); `TargetArchitecture` is what reads it."""
    if name == DEEPSEEK_V3_TINY:
        return TEXT_CONFIG.copy()
    text = TEXT_CONFIG.copy()
    del text["architectures"]
    return {
        "architectures": ["KimiK25ForConditionalGeneration"],
        "model_type": "kimi_k25",
        "text_config": text,
        "vision_config": VISION_CONFIG,
        "media_placeholder_token_id": 163605,
        "pad_token_id": PAD_ID,
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
    }


def recipe_fingerprint(conversations: list[TeacherConversation]) -> str:
    """Changes whenever the trained weights would (teacher prompts included)."""
    recipe = [
        RECIPE_VERSION,
        TEXT_CONFIG,
        SEED,
        TRAIN_STEPS,
        BATCH_TOKENS,
        LEARNING_RATE,
        WARMUP_STEPS,
        ROUTER_BIAS_STD,
        TOOL_CALL_REPEATS,
        conversations,
    ]
    return hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:16]


def is_current(name: str, out_dir: Path, teacher_paths: list[Path]) -> bool:
    """Whether `out_dir` holds `name` as this recipe and these teacher prompts build it."""
    try:
        stamp = json.loads((Path(out_dir) / STAMP).read_text())
    except (OSError, ValueError):
        return False
    wanted = {"name": name, "fingerprint": recipe_fingerprint(read_conversations(teacher_paths))}
    return stamp == wanted and (Path(out_dir) / "model.safetensors").is_file()


def trained_text_model(teacher_paths: list[Path]) -> tuple[dict[str, torch.Tensor], str]:
    """(the text model's state dict, its recipe fingerprint), trained on the teacher conversations."""
    conversations = read_conversations(teacher_paths)
    with tempfile.TemporaryDirectory(prefix="eaglepipe-kimi-layout-") as scratch:
        tokenizer = KimiTokenizer.from_dir(ensure_kimi_layout(Path(scratch) / "tokenizer").directory)
        samples = teacher_samples(tokenizer, conversations)
    samples += [s for s in samples if s.calls_tool] * (TOOL_CALL_REPEATS - 1)
    log.info("tiny target: training on %d teacher answers", len(samples))
    return train_on_teacher(samples, TEXT_CONFIG["vocab_size"]), recipe_fingerprint(conversations)


def write_tiny_target(name: str, out_dir: Path, state: dict[str, torch.Tensor], fingerprint: str) -> None:
    """Write the tiny target `name` to `out_dir` (replacing it whole, atomically): weights, config,
    generation config, Kimi-layout tokenizer files and, for Kimi-K2.5, its processor file."""
    if name not in TINY_TARGETS:
        raise TinyTargetError(f"config key 'target.embedded' = {name!r}: choose one of {TINY_TARGETS}")
    from safetensors.torch import load_file, save_file

    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}-", dir=out_dir.parent))
    staging.chmod(0o755)
    try:
        layout = ensure_kimi_layout(staging / ".tokenizer")
        full = _text_model(TEXT_CONFIG["vocab_size"], PAD_ID)
        full.load_state_dict(state)
        full.save_pretrained(staging / ".weights")  # transformers' own names (experts one by one)
        weights = load_file(str(staging / ".weights" / "model.safetensors"))
        if name == KIMI_K25_TINY:
            weights = _kimi_layout_names(weights)
            (staging / "preprocessor_config.json").write_text(json.dumps(PREPROCESSOR_CONFIG, indent=2))
        save_file(weights, str(staging / "model.safetensors"), metadata={"format": "pt"})
        for file in ("tiktoken.model", "tokenizer_config.json"):
            shutil.copy(layout.directory / file, staging / file)
        (staging / "config.json").write_text(json.dumps(target_config(name), indent=2))
        generation = {"bos_token_id": BOS_ID, "eos_token_id": STOP_ID, "pad_token_id": PAD_ID}
        (staging / "generation_config.json").write_text(json.dumps(generation, indent=2))
        (staging / STAMP).write_text(json.dumps({"name": name, "fingerprint": fingerprint}))
        for scratch in (".tokenizer", ".weights"):
            shutil.rmtree(staging / scratch)
        if out_dir.exists():
            shutil.rmtree(out_dir)
        os.replace(staging, out_dir)
    finally:
        if staging.exists():
            shutil.rmtree(staging)
    log.info("wrote %s to %s", name, out_dir)


def build_tiny_target(name: str, out_dir: Path, teacher_paths: list[Path]) -> None:
    """Train the tiny text model on the teacher conversations and write it as `name` to `out_dir`."""
    if name not in TINY_TARGETS:
        raise TinyTargetError(f"config key 'target.embedded' = {name!r}: choose one of {TINY_TARGETS}")
    write_tiny_target(name, out_dir, *trained_text_model(teacher_paths))
