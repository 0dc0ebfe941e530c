"""GenerationSettings for tests, with every configured field at the schema's default.

The schema is the only source of those defaults, so tests take them from it (through the config's own
validation) rather than repeating numbers; a test names only what it changes.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from eaglepipe.config import validate_config
from eaglepipe.openrouter.settings import GenerationSettings

SCHEMA = Path(__file__).resolve().parent.parent / "schemas" / "config.schema.yaml"


def default_config(**sections: Any) -> dict[str, Any]:
    """A minimal valid config, defaults filled, with `sections` given (e.g. `api={"model": ...}`)."""
    config = {
        "datasets": ["s"],
        "sources": {"s": {"type": "jsonl", "path": "s.jsonl"}},
        "target": {"name": "t", "path": "t"},
        "api": {"model": "m"},
        **sections,
    }
    return validate_config(config, SCHEMA)


def generation_settings(**fields: Any) -> GenerationSettings:
    """`fields` over what the default config builds (no kept endpoints: any server)."""
    config = default_config()
    defaults = GenerationSettings.from_sections(
        config["generation"],
        model=fields.get("model", config["api"]["model"]),
        base_url=fields["base_url"],
        fingerprint=fields["fingerprint"],
        kept=[],
        provider_obj=None,
        output_token_budget=config["budget"]["output_tokens_per_dataset"],
        usd_budget=config["budget"]["usd"],
        max_failed_fraction=config["generation"]["max_failed_fraction"],
    )
    return dataclasses.replace(defaults, **fields)
