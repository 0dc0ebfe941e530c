"""The validated config's shape, section by section, as schemas/config.schema.yaml gives it once its defaults
are filled: what `validate_config` returns, so the type checker holds every `config[...]` reading to a key
the schema has. The schema stays the only source of defaults and limits; `tests/test_config_types.py`
keeps these keys equal to its keys. No `from __future__ import annotations`: TypedDict reads NotRequired
only from evaluated annotations."""

from enum import Enum
from typing import Any, Literal, NotRequired, TypedDict


class PathsSection(TypedDict):
    results: str
    prompts: str


class JsonlSource(TypedDict):
    type: Literal["jsonl"]
    path: str
    strip_trailing_assistant: NotRequired[bool]


class HfSource(TypedDict):
    type: Literal["hf"]
    name: str
    config: NotRequired[str | None]
    split: NotRequired[str]
    revision: NotRequired[str | None]
    # A loader's data_files: a path, a list of them, or a split -> paths mapping, as `datasets` takes it.
    data_files: NotRequired[str | list[Any] | dict[str, Any] | None]
    format: NotRequired[Literal["openai", "sharegpt"]]
    field: NotRequired[str | None]
    prompt_field: NotRequired[str | None]
    sample: NotRequired[int | None]
    strip_trailing_assistant: NotRequired[bool]


class PromptsSection(TypedDict):
    seed: int
    strip_trailing_assistant: bool


class TargetSection(TypedDict):
    name: str
    path: str
    embedded: Literal[False, "smollm2-135m-instruct", "kimi-k25-tiny", "deepseek-v3-tiny"]
    hidden_size: NotRequired[int]
    active_parameters: NotRequired[int]


class PlanSection(TypedDict):
    tokens_per_s_per_request: float
    gpu_tflops: float
    load_gb_per_s: float


class ApiSection(TypedDict):
    base_url: str
    model: str
    key_file: str | None
    key_file_env: str
    emulator_text_like: Literal["exact", "vllm", "vllm_spaced", "sglang", "sglang_stripping"]


class Source(Enum):
    """Where a set's answers come from: `answers.source` (and `answers.sets`) by value, each record's
    `source` in responses.jsonl, and the rule that answers the set, as that rule's `source` param. A plain
    Enum on purpose: Snakemake leaves params of types it cannot represent out of its params rerun trigger,
    so naming the source reruns no finished set (the config's choice already decides which rule runs)."""

    OPENROUTER = "openrouter"
    ENGINE = "engine"
    IMPORT = "import"


class AskedSetAnswers(TypedDict):
    source: Literal["openrouter", "engine"]


class ImportedSetAnswers(TypedDict):
    source: Literal["import"]
    path: str


class AnswersSection(TypedDict):
    source: Literal["openrouter", "engine"]
    sets: dict[str, AskedSetAnswers | ImportedSetAnswers]


class EngineSection(TypedDict):
    server: Literal["vllm", "sglang"]
    base_url: str | None
    model: str | None
    python: str | None
    gpus: int
    args: list[str]
    start_timeout_s: float


class RoutingSection(TypedDict):
    quantizations: list[str]
    ignore: list[str]
    only: list[str]
    min_uptime: float | None
    require_parameters: list[str]


class GenerationSection(TypedDict):
    concurrency: int
    max_tokens: int
    temperature: float
    top_p: float
    seed: int | None
    # OpenRouter's reasoning object, sent as is: the schema takes any object.
    reasoning: dict[str, Any] | None
    stream: bool
    max_failed_fraction: float
    expected_completion_tokens: int
    return_token_ids: bool
    request_timeout_s: float
    max_attempts: int
    retry_failed: bool
    probe_answers: int
    breaker_strikes: int
    breaker_share: float
    logprobs: bool


class Prices(TypedDict):
    input: float
    output: float


class BudgetSection(TypedDict):
    usd: float
    policy: Literal["share", "in_order"]
    output_tokens_per_dataset: int
    price_per_m_tokens: Prices | None


class ProviderHabits(TypedDict, total=False):
    whitespace: Literal["keep", "pad", "strip", "rstrip"]
    tool_ids: Literal["keep", "renumber"]
    arguments: Literal["keep", "trim"]
    stop_billed: bool


class TokensSection(TypedDict):
    on_mismatch: Literal["drop", "keep"]
    on_segmentation: Literal["keep", "drop"]
    on_ambiguous: Literal["keep", "drop"]
    tool_format: Literal["typescript", "json"]
    providers: dict[str, ProviderHabits]


class HiddenSection(TypedDict):
    backend: Literal["hf", "sglang", "vllm"]
    aux_layers: list[int] | None
    dtype: Literal["float32", "bfloat16", "float16", "fp8", "int4", "int3"]
    device: str
    batch_tokens: int
    shard_tokens: int
    gpus: int
    max_samples: int | None
    max_tokens: int | None
    seed: int
    keep_free_gb: float
    engine_python: str | None
    memory_fraction: float


class DrafterSection(TypedDict):
    draft_vocab_size: int
    ttt_length: int
    lr: float
    epochs: int
    max_steps: int | None
    batches_per_step: int
    set_weights: dict[str, float]
    checkpoint_every: int
    curve_points: int
    batch_tokens: int
    max_seq_len: int
    warmup_ratio: float
    seed: int
    dtype: Literal["float32", "bfloat16"]
    device: str
    gpus: int
    export_speculators: bool


class EvalSection(TypedDict):
    holdout_per_dataset: int
    holdout_ids: list[str]
    max_new_tokens: int
    num_steps: int
    topk: Literal[1]
    num_draft_tokens: int
    batch_size: int
    device: str
    dtype: Literal["float32", "bfloat16"]


class JobResources(TypedDict):
    cpus: int
    mem_mb: int
    runtime_min: int


class ClusterSection(TypedDict):
    gpu_model: str | None
    tokens: JobResources
    generate_engine: JobResources
    hidden: JobResources
    train_drafter: JobResources
    evaluate_drafter: JobResources


class Config(TypedDict):
    datasets: list[str]
    paths: PathsSection
    sources: dict[str, JsonlSource | HfSource]
    prompts: PromptsSection
    target: TargetSection
    plan: PlanSection
    api: ApiSection
    answers: AnswersSection
    engine: EngineSection
    routing: RoutingSection
    generation: GenerationSection
    budget: BudgetSection
    tokens: TokensSection
    hidden: HiddenSection
    drafter: DrafterSection
    eval: EvalSection
    cluster: ClusterSection
