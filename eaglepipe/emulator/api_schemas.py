"""The reduced JSON Schemas of OpenRouter's answers, shipped beside the emulator that must satisfy them.

Each file under `schemas/` names the OpenAPI component it was derived from; the client can check live
answers against the same files.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema

SCHEMA_DIR = Path(__file__).parent / "schemas"
SCHEMA_NAMES = ("chat_result", "chat_chunk", "endpoints", "key", "generation", "models", "error")


@cache
def load_schema(name: str) -> dict[str, Any]:
    if name not in SCHEMA_NAMES:
        raise KeyError(f"no schema {name!r}; known: {', '.join(SCHEMA_NAMES)}")
    return json.loads((SCHEMA_DIR / f"{name}.json").read_text())


def validate(name: str, instance: Any) -> None:
    """Raise `jsonschema.ValidationError` unless `instance` has the shape of OpenRouter's `name` answer."""
    jsonschema.Draft202012Validator(load_schema(name)).validate(instance)
