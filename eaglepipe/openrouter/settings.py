"""What one generation job runs with, built from the validated config's sections.

The schema (schemas/config.schema.yaml) is the only source of defaults for configured fields: those fields
have none here, so a default can no longer drift from the schema. What has a default is not a config key
(the per-run URL, values read from providers.json, internal knobs).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any, TypedDict

from eaglepipe.chat_api import ChatRequestFields, Endpoint, ProviderPreferences, ServerExtras
from eaglepipe.config_types import Config, EngineSection, RoutingSection, Source
from eaglepipe.openrouter.dollars import DollarBudget
from eaglepipe.openrouter.errors import OpenRouterError
from eaglepipe.openrouter.routing import dearest_price


class EngineShaping(TypedDict):
    """The `generation` keys that shape an engine set's answers (token ids are always asked of an engine)."""

    max_tokens: int
    temperature: float
    top_p: float
    seed: int | None
    reasoning: dict[str, Any] | None


class Sampling(TypedDict):
    """What every request states: temperature and top_p (the schema always gives them), the seed when set."""

    temperature: float
    top_p: float
    seed: int | None


class AnswerShaping(EngineShaping):
    """The `generation` keys that shape a bought set's answers: in its request fingerprint, so a change reruns
    it (the spend plan reads expected_completion_tokens from the config itself)."""

    return_token_ids: bool
    logprobs: bool


class OperationalGeneration(TypedDict):
    """The `generation` keys that change how a job runs, not what it asks: they reach the job through the
    generation_settings file, so changing one reruns no finished set."""

    concurrency: int
    max_attempts: int
    retry_failed: bool
    request_timeout_s: float
    stream: bool
    probe_answers: int
    breaker_strikes: int
    breaker_share: float


class JobGeneration(AnswerShaping, OperationalGeneration):
    """What a job that asks a server runs with: the rule's shaping and the settings file's operations."""


class RequestParams(TypedDict):
    """The generate rule's `request` param."""

    model: str
    base_url: str
    emulator_text_like: str
    routing: RoutingSection
    generation: AnswerShaping


class EngineRequestParams(TypedDict):
    """The generate_engine rule's `request` param."""

    server: str
    target: str
    generation: EngineShaping


class OperationalParams(TypedDict):
    """The generation_settings rule's param, and the file it writes."""

    engine: EngineSection
    key_file: str | None
    key_file_env: str
    target_path: str
    generation: OperationalGeneration


# A param's value is compared by its repr: the keys below keep the order they always had, so that a finished
# set does not rerun for a reordering.
def request_params(config: Config) -> RequestParams:
    """What shapes the answers, as the generate rule's param (a change also changes its fingerprint)."""
    api = config["api"]
    return {
        "model": api["model"],
        "base_url": api["base_url"],
        "emulator_text_like": api["emulator_text_like"],
        "routing": config["routing"],
        "generation": {
            **_engine_shaping(config),
            "return_token_ids": config["generation"]["return_token_ids"],
            "logprobs": config["generation"]["logprobs"],
        },
    }


def engine_request_params(config: Config) -> EngineRequestParams:
    """What shapes an engine set's answers, as the generate_engine rule's param: the engine and the target it
    serves, and the sampling (token ids are always asked for, so those options do not apply)."""
    return {
        "server": config["engine"]["server"],
        "target": config["target"]["name"],
        "generation": _engine_shaping(config),
    }


def _engine_shaping(config: Config) -> EngineShaping:
    generation = config["generation"]
    return {
        "max_tokens": generation["max_tokens"],
        "temperature": generation["temperature"],
        "top_p": generation["top_p"],
        "seed": generation["seed"],
        "reasoning": generation["reasoning"],
    }


def operational_params(config: Config) -> OperationalParams:
    """How a generation job runs and reaches its server, as the generation_settings rule's param (an engine
    set's server included: where it runs, or how the job starts one)."""
    api, generation = config["api"], config["generation"]
    return {
        "engine": config["engine"],
        "key_file": api["key_file"],
        "key_file_env": api["key_file_env"],
        "target_path": config["target"]["path"],
        "generation": {
            "concurrency": generation["concurrency"],
            "max_attempts": generation["max_attempts"],
            "retry_failed": generation["retry_failed"],
            "request_timeout_s": generation["request_timeout_s"],
            "stream": generation["stream"],
            "probe_answers": generation["probe_answers"],
            "breaker_strikes": generation["breaker_strikes"],
            "breaker_share": generation["breaker_share"],
        },
    }


@dataclass(frozen=True, kw_only=True)
class GenerationSettings:
    """One prompt set's request shape and run limits. `fingerprint` is computed by the caller from the
    configured server identity (see `request_fingerprint`), since `base_url` may carry a per-run port.
    `output_token_budget` caps the set's completion tokens, resumed ones included, so a plain rerun of a
    set stopped by its budget does not spend a second budget. `concurrency` and `dollar_budget.run_usd` hold
    for the whole run: jobs running at once split the first and share the second through the ledger."""

    base_url: str
    model: str
    fingerprint: str
    max_tokens: int
    sampling: Sampling
    # The circuit breaker (breaker.py) and the usability probe's length (answers checked per provider).
    breaker_strikes: int
    breaker_share: float
    probe_answers: int
    reasoning: dict[str, Any] | None
    concurrency: int
    max_attempts: int
    # Ask again the prompts an earlier run recorded as failed for good (journal.py: failed.jsonl).
    retry_failed: bool
    request_timeout_s: float
    output_token_budget: int | None
    # What a bought set may spend (eaglepipe/openrouter/dollars.py); None: nothing is bought.
    dollar_budget: DollarBudget | None
    max_failed_fraction: float
    stream: bool
    return_token_ids: bool
    # Ask for each output token's logprob and bytes (exact ids for the token stage where providers send them).
    logprobs: bool
    provider_obj: ProviderPreferences | None = None
    # Display names (as responses report them) of the endpoints routing kept; empty = any server.
    allowed_providers: tuple[str, ...] = ()
    # (display name, tag) of each kept endpoint: dropping a provider removes its tags from `provider.only`.
    endpoint_tags: tuple[tuple[str, str], ...] = ()
    # An upper bound on one request's cost, used until answers are seen (dearest price x max_tokens).
    expected_request_usd: float = 0.0
    # The dearest kept endpoint's prompt price (USD per token): with the above, what OpenRouter reserves per
    # request in flight, which sizes the first wave against the key's `limit_remaining`.
    prompt_usd_per_token: float = 0.0
    backoff_base_s: float = 1.0
    backoff_max_s: float = 60.0
    # How long to wait for `GET /generation` to know a request that was cut off or killed.
    recovery_wait_s: float = 10.0
    progress: bool = True
    # The server is the project's emulator (api.base_url: local): its providers and dollars are simulated.
    emulated: bool = False
    # Where the answers come from (each record's `source`); only `openrouter` is bought (`paid`).
    source: Source = Source.OPENROUTER
    # The `provider` recorded for an answer whose server names none (an engine: "vllm", "sglang").
    server_name: str | None = None
    # What a request adds to get the server's ids back in its own form (see eaglepipe/answers/engine.py).
    extra_request_fields: ServerExtras = field(default_factory=lambda: ServerExtras())

    @classmethod
    def from_sections(
        cls,
        generation: JobGeneration,
        *,
        model: str,
        base_url: str,
        fingerprint: str,
        kept: list[Endpoint],
        provider_obj: ProviderPreferences | None,
        output_token_budget: int | None,
        dollar_budget: DollarBudget | None,
        max_failed_fraction: float,
        emulated: bool = False,
        source: Source = Source.OPENROUTER,
        server_name: str | None = None,
        extra_request_fields: ServerExtras | None = None,
    ) -> GenerationSettings:
        """From the validated `generation` section, the endpoints routing kept (providers.json), and what
        completes a set (the budgets, `generation.max_failed_fraction`), which the rule holds as params;
        `base_url` is the server this job reaches (an emulator's per-run port). An engine of the team's own
        (`source` engine) is paid nothing and names itself `server_name`."""
        named = [e for e in kept if e.get("provider_name")]
        return cls(
            base_url=base_url,
            model=model,
            fingerprint=fingerprint,
            max_tokens=generation["max_tokens"],
            sampling={
                "temperature": generation["temperature"],
                "top_p": generation["top_p"],
                "seed": generation["seed"],
            },
            provider_obj=provider_obj,
            allowed_providers=tuple(sorted({e["provider_name"] for e in named})),
            endpoint_tags=tuple((e["provider_name"], e["tag"]) for e in named),
            breaker_strikes=generation["breaker_strikes"],
            breaker_share=generation["breaker_share"],
            probe_answers=generation["probe_answers"],
            logprobs=generation["logprobs"],
            max_failed_fraction=max_failed_fraction,
            reasoning=generation["reasoning"],
            concurrency=generation["concurrency"],
            max_attempts=generation["max_attempts"],
            retry_failed=generation["retry_failed"],
            request_timeout_s=generation["request_timeout_s"],
            output_token_budget=output_token_budget,
            dollar_budget=dollar_budget,
            expected_request_usd=max_request_usd(kept, generation["max_tokens"]),
            prompt_usd_per_token=dearest_price(kept, "prompt"),
            stream=generation["stream"],
            return_token_ids=generation["return_token_ids"],
            emulated=emulated,
            source=source,
            server_name=server_name,
            extra_request_fields=extra_request_fields or ServerExtras(),
        )

    def __post_init__(self) -> None:
        for name in ("max_tokens", "concurrency", "max_attempts"):
            if getattr(self, name) < 1:
                raise OpenRouterError(
                    f"generation setting {name} = {getattr(self, name)}: must be at least 1"
                )
        if self.request_timeout_s <= 0:
            raise OpenRouterError(
                f"generation setting request_timeout_s = {self.request_timeout_s}: must be > 0"
            )

    @property
    def paid(self) -> bool:
        """Bought through OpenRouter: a key to check, a price, `/generation` to settle with."""
        return self.source is Source.OPENROUTER

    def shared_request_fields(self, dropped: frozenset[str] = frozenset()) -> ChatRequestFields:
        """The request body minus the prompt: also what each record keeps as its `request`. Endpoints of
        `dropped` providers (display names, lower case) leave `provider.only`."""
        fields: ChatRequestFields = {"model": self.model, "max_tokens": self.max_tokens}
        sampling = self.sampling
        fields["temperature"] = sampling["temperature"]
        fields["top_p"] = sampling["top_p"]
        if sampling["seed"] is not None:
            fields["seed"] = sampling["seed"]
        if self.provider_obj is not None:
            fields["provider"] = self.provider_obj
            gone = {tag for name, tag in self.endpoint_tags if name.lower() in dropped}
            if gone and "only" in self.provider_obj:
                only = [tag for tag in self.provider_obj["only"] if tag not in gone]
                fields["provider"] = {**self.provider_obj, "only": only}
        if self.reasoning is not None:
            fields["reasoning"] = self.reasoning
        fields["usage"] = {"include": True}
        fields["stream"] = self.stream
        if self.return_token_ids:
            fields["return_token_ids"] = True
        if self.logprobs:
            fields["logprobs"] = True
            fields["top_logprobs"] = 0
        fields.update(self.extra_request_fields)
        return fields


def max_request_usd(endpoints: list[Endpoint], max_tokens: int) -> float:
    """An upper bound on one request's output cost: the dearest kept endpoint at max_tokens."""
    return dearest_price(endpoints, "completion") * max_tokens


@dataclass(frozen=True, kw_only=True)
class ApiSettings:
    """The server a job talks to and where its key is (the `api` section), and the target directory the
    local emulator serves and the usability probe tokenizes with (`target.path`)."""

    model: str
    base_url: str
    key_file: str | None
    key_file_env: str
    emulator_text_like: str
    target_path: str

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> ApiSettings:
        """From the providers rule's params, or a generate job's `request_params` and generation_settings
        file together: each holds these fields under these names."""
        return cls(**{f.name: params[f.name] for f in fields(cls)})

    @property
    def local(self) -> bool:
        """`api.base_url: local`: the bundled emulator, started for the job's own duration."""
        return self.base_url == "local"
