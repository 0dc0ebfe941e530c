"""The table of provider endpoints the emulator pretends to route between.

The default mimics what OpenRouter lists for a popular open model: one model served by several providers
at different quantizations and prices, one of them down, some uptimes unknown. A `--config` file
(YAML or JSON, `{"endpoints": [...]}`) replaces it to rehearse a particular situation. For a Kimi-layout
target (and the tests' Kimi mode) an endpoint's `habits` say how its provider returns reasoning and tool
calls (`ReplyHabits`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any, cast

import yaml

from eaglepipe.chat_api import Endpoint as ListedEndpoint
from eaglepipe.emulator.errors import EmulatorError
from eaglepipe.emulator.text_like import SWITCHES

# What an endpoint may list in `supported_parameters`; a request parameter it lacks is silently ignored.
FULL_PARAMETERS = [
    "max_tokens",
    "temperature",
    "top_p",
    "seed",
    "tools",
    "tool_choice",
    "reasoning",
    "include_reasoning",
    "logprobs",
    "top_logprobs",
]

# Prices in USD per million tokens (prompt, completion); served as USD per token, like OpenRouter.
# fmt: off
DEFAULT_ENDPOINTS: list[dict[str, Any]] = [
    {"provider_name": "Chutes", "tag": "chutes/int4", "quantization": "int4", "price_per_m": (0.40, 2.00)},
    {"provider_name": "Chutes", "tag": "chutes/fp8", "quantization": "fp8", "price_per_m": (0.25, 1.10),
     "status": -1, "uptime_last_30m": 41.0},
    {"provider_name": "Moonshot AI", "tag": "moonshotai", "quantization": "int4", "price_per_m": (0.60, 2.50),
     "uptime_last_5m": None, "latency_last_30m": {"p50": 0.21, "p75": 0.3, "p90": 0.44, "p99": 0.9}},
    {"provider_name": "Novita", "tag": "novita", "quantization": "int4", "price_per_m": (0.20, 1.00),
     "status": -2, "uptime_last_30m": 12.5},
    {"provider_name": "DeepInfra", "tag": "deepinfra", "quantization": "bf16", "price_per_m": (0.50, 2.80)},
    {"provider_name": "DeepInfra", "tag": "deepinfra/turbo", "quantization": "nvfp4",
     "price_per_m": (0.30, 1.20)},
    {"provider_name": "Fireworks", "tag": "fireworks", "quantization": "fp8", "price_per_m": (0.55, 2.75),
     "bills_stop_token": False},
    {"provider_name": "BaseTen", "tag": "baseten", "quantization": "fp4", "price_per_m": (0.45, 2.20),
     "supported_parameters": ["max_tokens", "temperature", "top_p", "tools", "tool_choice"]},
    {"provider_name": "Together", "tag": "together", "quantization": "mxfp8", "price_per_m": (0.50, 2.60)},
    {"provider_name": "Parasail", "tag": "parasail", "quantization": "unknown", "price_per_m": (0.45, 2.40),
     "uptime_last_1d": None, "throughput_last_30m": {"p50": 95.0, "p75": 80.0, "p90": 61.0, "p99": 20.0}},
    {"provider_name": "AtlasCloud", "tag": "atlascloud", "quantization": None, "price_per_m": (0.42, 2.30)},
]
# fmt: on

# `answers_as`: the display name this endpoint's answers (and `/generation`) carry when it is not the
# listed `provider_name`, as when OpenRouter renames a provider ("Foo" listed, "Foo (beta)" answering).
_EMULATOR_ONLY_KEYS = {"bills_stop_token", "habits", "answers_as"}

# Each habit's choices, the default first.
HABIT_CHOICES: dict[str, tuple[str, ...]] = {
    "text_like": ("vllm", *(name for name in SWITCHES if name != "vllm")),
    "reasoning_field": ("reasoning", "details_only"),
    "tool_ids": ("engine", "call_random", "renumbered"),
    "tool_index": ("proper", "zero"),
    "tool_parser": ("sound", "drops_text", "leaks_markers"),
}


@dataclass(frozen=True)
class ReplyHabits:
    """How an endpoint's provider returns a Kimi answer (a Kimi-layout target; others send plain content).

    `text_like`: the engine switch (text_like.py) that turns the ids into reasoning, content and tool calls.
    `reasoning_field`: `reasoning` sends the reasoning in `reasoning` and `reasoning_details`,
    `details_only` only as `reasoning.text` items of `reasoning_details`. `tool_ids`: the engine's ids,
    `call_<random>` ids, or `functions.NAME:N` renumbered from 0 in each answer. `tool_index`: streamed
    calls at their own `index`, or all at index 0 each with its own id. `tool_parser`: `drops_text` loses
    the content before a tool section, `leaks_markers` leaves the section's raw text in the content (both
    seen with Kimi parsers in public vLLM issues).
    """

    text_like: str = "vllm"
    reasoning_field: str = "reasoning"
    tool_ids: str = "engine"
    tool_index: str = "proper"
    tool_parser: str = "sound"


def _habits(value: Any, where: str) -> ReplyHabits:
    if not isinstance(value, dict):
        raise EmulatorError(f"{where}: 'habits' must be an object of {', '.join(HABIT_CHOICES)}")
    for name, choice in value.items():
        if name not in HABIT_CHOICES:
            raise EmulatorError(f"{where}: unknown habit {name!r} (known: {', '.join(HABIT_CHOICES)})")
        if choice not in HABIT_CHOICES[name]:
            raise EmulatorError(
                f"{where}: habits.{name} {choice!r} is not one of {', '.join(HABIT_CHOICES[name])}"
            )
    return ReplyHabits(**value)


_PUBLIC_KEYS = {
    "name",
    "model_id",
    "model_name",
    "context_length",
    "pricing",
    "provider_name",
    "tag",
    "quantization",
    "max_completion_tokens",
    "max_prompt_tokens",
    "supported_parameters",
    "status",
    "uptime_last_30m",
    "uptime_last_5m",
    "uptime_last_1d",
    "supports_implicit_caching",
    "latency_last_30m",
    "throughput_last_30m",
}


@dataclass(frozen=True)
class Endpoint:
    """One routable endpoint: the object `/endpoints` shows, plus how the emulator bills it."""

    public: ListedEndpoint
    bills_stop_token: bool = True
    habits: ReplyHabits = field(default_factory=ReplyHabits)
    answers_as: str | None = None

    @property
    def answer_name(self) -> str:
        """The provider name answers report: the listed one unless the endpoint's name drifts."""
        return self.answers_as or self.public["provider_name"]

    @property
    def tag(self) -> str:
        return self.public["tag"]

    @property
    def status(self) -> int:
        return self.public["status"]

    def price(self, kind: str) -> float:
        """USD per token (or per request for `request`); 0 where the table names no price."""
        pricing: Mapping[str, object] = self.public["pricing"]
        return float(str(pricing.get(kind, "0")))

    def supports(self, parameter: str) -> bool:
        return parameter in self.public["supported_parameters"]

    def with_text_like(self, switch: str) -> Endpoint:
        """This endpoint with its habits' engine switch replaced (`--text-like` for a Kimi-layout model)."""
        return replace(self, habits=replace(self.habits, text_like=switch))


def _per_token(usd_per_million: float) -> str:
    return format(Decimal(str(usd_per_million)) / Decimal(1_000_000), "f")


def _price_string(value: Any, where: str) -> str:
    try:
        price = Decimal(str(value))
    except InvalidOperation:
        price = Decimal(-1)
    if isinstance(value, bool) or not price.is_finite() or price < 0:
        raise EmulatorError(f"{where}: price {value!r} is not a non-negative number of USD per token")
    return format(price, "f")


def _expand(entry: dict[str, Any], model_id: str, context_length: int, where: str) -> Endpoint:
    entry = dict(entry)
    if "price_per_m" in entry:
        prompt, completion = entry.pop("price_per_m")
        entry["pricing"] = {"prompt": _per_token(prompt), "completion": _per_token(completion)}
    unknown = sorted(set(entry) - _PUBLIC_KEYS - _EMULATOR_ONLY_KEYS)
    if unknown:
        raise EmulatorError(
            f"{where}: unknown key {unknown[0]!r} (allowed: {', '.join(sorted(_PUBLIC_KEYS))}, "
            "bills_stop_token, habits, answers_as)"
        )
    for key in ("provider_name", "tag", "quantization", "pricing"):
        if key not in entry:
            raise EmulatorError(f"{where}: missing key {key!r}")
    pricing = entry["pricing"]
    if not isinstance(pricing, dict) or not {"prompt", "completion"} <= set(pricing):
        raise EmulatorError(f"{where}: 'pricing' needs 'prompt' and 'completion' (USD per token)")
    entry["pricing"] = {
        kind: _price_string(value, f"{where}.pricing.{kind}") for kind, value in pricing.items()
    }
    bills_stop_token = entry.pop("bills_stop_token", True)
    if not isinstance(bills_stop_token, bool):
        raise EmulatorError(f"{where}: 'bills_stop_token' must be true or false")
    habits = _habits(entry.pop("habits", {}), where)
    answers_as = entry.pop("answers_as", None)
    if answers_as is not None and not (isinstance(answers_as, str) and answers_as):
        raise EmulatorError(f"{where}: 'answers_as' must be a provider display name such as 'Foo (beta)'")
    # The listing's keys, checked above; the config's values stand as given (a test may list odd ones).
    public = {
        "name": f"{entry['provider_name']} | {model_id}",
        "model_id": model_id,
        "model_name": model_id,
        "context_length": context_length,
        "max_completion_tokens": min(65536, context_length),  # as Kimi-K2.5's endpoints allow
        "max_prompt_tokens": None,
        "supported_parameters": list(FULL_PARAMETERS),
        "status": 0,
        "uptime_last_30m": 99.6,
        "uptime_last_5m": 100.0,
        "uptime_last_1d": 99.2,
        "supports_implicit_caching": False,
        "latency_last_30m": {"p50": 0.42, "p75": 0.61, "p90": 0.95, "p99": 2.1},
        "throughput_last_30m": {"p50": 48.0, "p75": 41.0, "p90": 30.5, "p99": 12.0},
        **entry,
    }
    if not isinstance(public["status"], int) or public["status"] > 0:
        raise EmulatorError(f"{where}: 'status' must be 0 (normal) or a negative integer (degraded/down)")
    return Endpoint(
        public=cast(ListedEndpoint, public),
        bills_stop_token=bills_stop_token,
        habits=habits,
        answers_as=answers_as,
    )


def load_endpoints(config_path: Path | None, model_id: str, context_length: int) -> list[Endpoint]:
    """The endpoint table: the default, or the `endpoints` list of a config file."""
    if config_path is None:
        entries, source = DEFAULT_ENDPOINTS, "default endpoint table"
    else:
        try:
            config = yaml.safe_load(config_path.read_text())
        except (OSError, yaml.YAMLError) as exc:
            raise EmulatorError(f"{config_path}: cannot read emulator config ({exc})") from None
        if not isinstance(config, dict) or set(config) != {"endpoints"}:
            raise EmulatorError(
                f"{config_path}: expected one top-level key 'endpoints' (a list of endpoints)"
            )
        entries, source = config["endpoints"], str(config_path)
        if not isinstance(entries, list) or not entries or not all(isinstance(e, dict) for e in entries):
            raise EmulatorError(f"{config_path}: 'endpoints' must be a non-empty list of objects")
    endpoints = [
        _expand(e, model_id, context_length, f"{source}: endpoints[{i}]") for i, e in enumerate(entries)
    ]
    tags = [e.tag for e in endpoints]
    duplicated = sorted({t for t in tags if tags.count(t) > 1})
    if duplicated:
        raise EmulatorError(f"{source}: tag {duplicated[0]!r} appears twice; tags must be unique")
    return endpoints
