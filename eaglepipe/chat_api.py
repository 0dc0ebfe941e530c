"""The OpenAI/OpenRouter chat-completions wire payloads, as OpenRouter's API description gives them.

One set of types for both sides: the emulator builds these bodies and the OpenRouter client reads them, so a
field renamed on one side shows up on the other. A conversation's turns, tools and tool calls are the
records every stage holds (eaglepipe/messages.py). Keys the description leaves optional are NotRequired.
Finish reasons stay `str`: providers send their own words (`end_turn`, `SAFETY`), which the client's reply
taxonomy has to see as sent; `FinishReason` is the set OpenRouter documents.
"""

from __future__ import annotations

from typing import Any, Literal, NotRequired, TypedDict

from eaglepipe.messages import Message, Tool, ToolCall

FinishReason = Literal["tool_calls", "stop", "length", "content_filter", "error"]
Quantization = Literal[
    "int4", "int8", "fp4", "mxfp4", "nvfp4", "fp6", "fp8", "mxfp8", "fp16", "bf16", "fp32", "unknown"
]
ReasoningType = Literal[
    "reasoning.text", "reasoning.summary", "reasoning.encrypted", "reasoning.server_tool_call"
]


# --- the request -------------------------------------------------------------------------------------------


class MaxPrice(TypedDict, total=False):
    """USD per million tokens (`prompt`, `completion`) or per request/image: no dearer endpoint serves."""

    prompt: float | str
    completion: float | str
    request: float | str
    image: float | str


class ProviderPreferences(TypedDict, total=False):
    """The request's `provider` object: which endpoints OpenRouter may route to."""

    only: list[str]
    ignore: list[str]
    order: list[str]
    quantizations: list[str]
    allow_fallbacks: bool
    require_parameters: bool
    sort: Literal["price", "throughput", "latency"]
    max_price: MaxPrice
    data_collection: Literal["allow", "deny"]


class UsageRequest(TypedDict):
    include: bool


class StreamOptions(TypedDict):
    include_usage: bool


class ServerExtras(TypedDict, total=False):
    """What a request adds to get an engine's token ids back in its own form (eaglepipe/answers/engine.py):
    vLLM's and SGLang's extensions, and the logprobs OpenRouter documents."""

    return_token_ids: bool  # vLLM: the answer's (and prompt's) token ids
    return_prompt_token_ids: bool  # SGLang: the prompt's ids
    stream_options: StreamOptions
    logprobs: bool
    top_logprobs: int


class ChatRequestFields(ServerExtras):
    """The `/chat/completions` request body minus its conversation: what every request of a set shares, and
    what each record keeps as its `request`."""

    model: str
    max_tokens: NotRequired[int]
    temperature: NotRequired[float]
    top_p: NotRequired[float]
    seed: NotRequired[int]
    provider: NotRequired[ProviderPreferences]
    # The config's `generation.reasoning`, sent as is: OpenRouter's reasoning object differs by API.
    reasoning: NotRequired[dict[str, Any]]
    usage: NotRequired[UsageRequest]
    stream: NotRequired[bool]


class ChatRequestBody(ChatRequestFields):
    """The `/chat/completions` request body, the fields this pipeline sends."""

    messages: list[Message]
    tools: NotRequired[list[Tool]]


# --- the answer --------------------------------------------------------------------------------------------


class FunctionCallDelta(TypedDict, total=False):
    name: str
    arguments: str


class ToolCallDelta(TypedDict):
    """A streamed fragment of a tool call: `index` joins the fragments (id, type and name come first)."""

    index: int
    id: NotRequired[str]
    type: NotRequired[Literal["function"]]
    function: NotRequired[FunctionCallDelta]


class ReasoningDetail(TypedDict):
    type: ReasoningType
    text: NotRequired[str | None]
    summary: NotRequired[str]
    data: NotRequired[str]
    format: NotRequired[str | None]
    index: NotRequired[int]
    id: NotRequired[str | None]
    signature: NotRequired[str | None]


class MessageFields(TypedDict, total=False):
    """What a provider makes of an answer's text: the assistant message without its fixed fields."""

    content: str | None
    reasoning: str | None
    reasoning_details: list[ReasoningDetail]
    tool_calls: list[ToolCall]


class ChatMessage(MessageFields):
    """The assistant message of a whole (not streamed) answer."""

    role: Literal["assistant"]
    refusal: NotRequired[str | None]


class TopLogprob(TypedDict):
    token: str
    bytes: list[int] | None
    logprob: float


class TokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob]


class Logprobs(TypedDict):
    content: list[TokenLogprob] | None
    refusal: NotRequired[list[TokenLogprob] | None]


class PromptTokensDetails(TypedDict, total=False):
    cached_tokens: int
    cache_write_tokens: int
    audio_tokens: int
    video_tokens: int


class CompletionTokensDetails(TypedDict, total=False):
    reasoning_tokens: int | None
    audio_tokens: int | None
    accepted_prediction_tokens: int | None
    rejected_prediction_tokens: int | None


class CostDetails(TypedDict):
    upstream_inference_cost: NotRequired[float | None]  # BYOK only
    upstream_inference_prompt_cost: float
    upstream_inference_completions_cost: float


class Usage(TypedDict):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    cost: NotRequired[float | None]  # USD
    is_byok: NotRequired[bool]
    prompt_tokens_details: NotRequired[PromptTokensDetails | None]
    completion_tokens_details: NotRequired[CompletionTokensDetails | None]
    cost_details: NotRequired[CostDetails | None]


class Availability(TypedDict):
    retry_after: float
    retryable: bool


class ApiErrorObject(TypedDict):
    """`{"error": ...}`'s object; `metadata` is an open object (`error_type`, `provider_name`, `raw`,
    `retry_after`, whatever the provider adds), so its values stay untyped."""

    code: int | str  # the HTTP status as a rule, but providers send names and status text too
    message: str
    metadata: NotRequired[dict[str, Any]]
    availability: NotRequired[Availability]


class ErrorBody(TypedDict):
    error: ApiErrorObject


class Choice(TypedDict):
    index: int
    message: ChatMessage
    finish_reason: str | None
    native_finish_reason: NotRequired[str | None]
    logprobs: NotRequired[Logprobs | None]
    error: NotRequired[ApiErrorObject]  # the provider failed inside an HTTP 200
    token_ids: NotRequired[list[int]]  # the answer's ids, with `return_token_ids`


class ChatCompletion(TypedDict):
    """A whole `/chat/completions` answer."""

    id: str
    object: Literal["chat.completion"]
    created: int
    model: str
    provider: NotRequired[str]  # OpenRouter's: the display name of the endpoint that served
    system_fingerprint: str | None
    choices: list[Choice]
    usage: NotRequired[Usage]
    prompt_token_ids: NotRequired[list[int]]


class StreamDelta(TypedDict, total=False):
    role: Literal["assistant"]
    content: str | None
    reasoning: str | None
    reasoning_details: list[ReasoningDetail]
    refusal: str | None
    tool_calls: list[ToolCallDelta]


class StreamChoice(TypedDict):
    index: int
    delta: StreamDelta
    finish_reason: str | None
    native_finish_reason: NotRequired[str | None]
    logprobs: NotRequired[Logprobs | None]
    token_ids: NotRequired[list[int]]


class StreamChunk(TypedDict):
    """One `data:` event of a streamed answer; the last carries `usage` (and often no choices)."""

    id: str
    object: Literal["chat.completion.chunk"]
    created: int
    model: str
    provider: NotRequired[str]
    system_fingerprint: NotRequired[str | None]
    choices: list[StreamChoice]
    usage: NotRequired[Usage]
    error: NotRequired[ApiErrorObject]
    prompt_token_ids: NotRequired[list[int]]


# --- the models' endpoints, /generation and /key ----------------------------------------------------------


class Pricing(TypedDict):
    """USD per token (per request, per image) as decimal strings."""

    prompt: str
    completion: str
    request: NotRequired[str]
    image: NotRequired[str]
    web_search: NotRequired[str]
    internal_reasoning: NotRequired[str]
    input_cache_read: NotRequired[str]
    input_cache_write: NotRequired[str]
    discount: NotRequired[float]


class PercentileStats(TypedDict):
    p50: float
    p75: float
    p90: float
    p99: float


class Endpoint(TypedDict):
    """One provider endpoint of a model, as `/models/{author}/{slug}/endpoints` lists it."""

    name: str
    model_id: str
    model_name: str
    context_length: int
    pricing: Pricing
    provider_name: str
    tag: str  # the routing slug: `provider` or `provider/variant`
    quantization: Quantization | None
    max_completion_tokens: int | None
    max_prompt_tokens: int | None
    supported_parameters: list[str]
    status: NotRequired[int]  # 0 normal; negative: degraded (-1 ... -3), down (-5, -10)
    uptime_last_30m: float | None  # percent; null when too little traffic to tell
    uptime_last_5m: float | None
    uptime_last_1d: float | None
    supports_implicit_caching: bool
    latency_last_30m: PercentileStats | None
    throughput_last_30m: PercentileStats | None


class GenerationRecord(TypedDict):
    """`GET /generation?id=`'s `data`: what OpenRouter billed for one answer (USD, milliseconds)."""

    id: str
    upstream_id: str | None
    total_cost: float
    usage: float
    cache_discount: float | None
    upstream_inference_cost: float | None
    created_at: str
    model: str
    provider_name: str | None
    app_id: int | None
    streamed: bool | None
    cancelled: bool | None
    latency: float | None
    moderation_latency: float | None
    generation_time: float | None
    finish_reason: str | None
    native_finish_reason: str | None
    tokens_prompt: int | None
    tokens_completion: int | None
    native_tokens_prompt: int | None
    native_tokens_completion: int | None
    native_tokens_completion_images: int | None
    native_tokens_reasoning: int | None
    native_tokens_cached: int | None
    num_media_prompt: int | None
    num_input_audio_prompt: int | None
    num_media_completion: int | None
    num_search_results: int | None
    num_fetches: int | None
    web_search_engine: str | None
    origin: str
    is_byok: bool
    external_user: str | None
    api_type: str | None
    preset_id: str | None
    router: str | None
    provider_responses: list[Any] | None
    user_agent: str | None
    http_referer: str | None
    data_region: str | None
    workspace_id: str | None
    service_tier: str | None


class RateLimit(TypedDict):
    requests: int
    interval: str
    note: str


class KeyRecord(TypedDict):
    """`GET /key`'s `data`: the key's spend (USD) against its limit."""

    label: str
    limit: float | None
    limit_remaining: float | None
    limit_reset: str | None
    include_byok_in_limit: bool
    usage: float
    usage_daily: float
    usage_weekly: float
    usage_monthly: float
    byok_usage: float
    byok_usage_daily: float
    byok_usage_weekly: float
    byok_usage_monthly: float
    is_free_tier: bool
    is_management_key: bool
    is_provisioning_key: bool
    creator_user_id: str | None
    expires_at: str | None
    rate_limit: NotRequired[RateLimit]  # deprecated
