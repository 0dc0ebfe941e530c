"""Stage settings for tests, built the pipeline's way: a minimal config validated against the schema (which
fills every default), its section overridden where a test says so, then the stage's `from_section`."""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from eaglepipe.config import validate_config
from eaglepipe.config_types import Config
from eaglepipe.drafter.evaluate import EvalSettings
from eaglepipe.drafter.train import TrainSettings
from eaglepipe.hidden.extract import HiddenSettings
from eaglepipe.openrouter.dollars import DollarBudget
from eaglepipe.openrouter.settings import GenerationSettings
from eaglepipe.tokens.profile import ProviderPin
from eaglepipe.tokens.rebuild import TokenSettings

SCHEMA = Path(__file__).resolve().parent.parent / "schemas" / "config.schema.yaml"
MINIMAL_CONFIG = {
    "datasets": ["demo"],
    "sources": {"demo": {"type": "jsonl", "path": "demo.jsonl"}},
    "target": {"name": "test-target", "path": "target"},
    "api": {"model": "test-model"},
}

# The schema's defaults are a GPU run's; the CPU tests train and evaluate smaller and in float32, as they did
# before their settings came from the schema.
CPU_TRAINING = {
    "device": "cpu",
    "dtype": "float32",
    "epochs": 1,
    "batch_tokens": 4096,
    "max_seq_len": 2048,
    "warmup_ratio": 0.05,
    "checkpoint_every": 0,
}
CPU_EVALUATION = {"device": "cpu", "dtype": "float32", "max_new_tokens": 128}
CPU_HIDDEN = {"device": "cpu"}


def default_config(**sections: Any) -> Config:
    """The minimal config, defaults filled, with whole `sections` given (e.g. `api={"model": ...}`)."""
    return validate_config({**copy.deepcopy(MINIMAL_CONFIG), **sections}, SCHEMA)


def section(name: str, **overrides: Any) -> Any:
    """The validated config's `name` section, defaults filled, with `overrides` (validated too): the section's
    own TypedDict, which a name known only at run time cannot give the type checker."""
    config = copy.deepcopy(MINIMAL_CONFIG)
    config[name] = overrides
    validated: Mapping[str, Any] = validate_config(config, SCHEMA)
    return validated[name]


def token_settings(*, pins: dict[str, ProviderPin] | None = None, **overrides: Any) -> TokenSettings:
    """`pins`: providers' pins as objects, in place of the section's `providers`."""
    settings = TokenSettings.from_section(section("tokens", **overrides))
    return settings if pins is None else dataclasses.replace(settings, providers=pins)


def hidden_settings(*, target_name: str = "smollm2", gpus: int = 0, **overrides: Any) -> HiddenSettings:
    return HiddenSettings.from_section(
        section("hidden", **{**CPU_HIDDEN, **overrides}), target_name=target_name, gpus=gpus
    )


def train_settings(**overrides: Any) -> TrainSettings:
    return TrainSettings.from_section(section("drafter", **{**CPU_TRAINING, **overrides}))


def eval_settings(**overrides: Any) -> EvalSettings:
    return EvalSettings.from_section(section("eval", **{**CPU_EVALUATION, **overrides}))


def generation_settings(**fields: Any) -> GenerationSettings:
    """`fields` over what the default config builds (no kept endpoints: any server); `base_url` and
    `fingerprint` are the caller's, as a job's are."""
    config = default_config()
    defaults = GenerationSettings.from_sections(
        config["generation"],
        model=fields.get("model", config["api"]["model"]),
        base_url=fields["base_url"],
        fingerprint=fields["fingerprint"],
        kept=[],
        provider_obj=None,
        output_token_budget=config["budget"]["output_tokens_per_dataset"],
        dollar_budget=DollarBudget(policy="in_order", run_usd=float(config["budget"]["usd"]), set_usd=None),
        max_failed_fraction=config["generation"]["max_failed_fraction"],
    )
    return dataclasses.replace(defaults, **fields)
