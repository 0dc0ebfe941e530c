"""The config's TypedDicts (eaglepipe/config_types.py) have the schema's keys at every level, and a key is
required in the type exactly where the validated config always has it (a default, or `required`)."""

from __future__ import annotations

import types
import typing
from pathlib import Path
from typing import Any

import yaml

from eaglepipe.config_types import Config

SCHEMA = Path(__file__).resolve().parent.parent / "schemas" / "config.schema.yaml"


def typed_dicts(annotation: Any) -> list[type]:
    """The TypedDicts an annotation holds directly, in a union, or as a dict's values."""
    if typing.is_typeddict(annotation):
        return [annotation]
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        return [found for arg in typing.get_args(annotation) for found in typed_dicts(arg)]
    if origin is dict:
        return typed_dicts(typing.get_args(annotation)[1])
    return []


def object_schemas(node: dict[str, Any]) -> list[dict[str, Any]]:
    """The object schemas a property's schema allows: itself, its `oneOf` branches, a map's values."""
    if "oneOf" in node:
        return [found for branch in node["oneOf"] for found in object_schemas(branch)]
    if "properties" in node:
        return [node]
    if isinstance(node.get("additionalProperties"), dict):
        return object_schemas(node["additionalProperties"])
    return []


def mismatches(typed: type, node: dict[str, Any], where: str) -> list[str]:
    found = []
    properties = node["properties"]
    keys = set(typing.get_type_hints(typed))
    if keys != set(properties):
        found.append(f"{where}: only in the type {sorted(keys - set(properties))}, "
                     f"only in the schema {sorted(set(properties) - keys)}")
    always = {name for name, sub in properties.items() if "default" in sub} | set(node.get("required", []))
    if typed.__total__ and typed.__required_keys__ != always & keys:  # type: ignore[attr-defined]
        found.append(f"{where}: required {sorted(typed.__required_keys__)}, schema {sorted(always)}")  # type: ignore[attr-defined]
    hints = typing.get_type_hints(typed)
    for name in keys & set(properties):
        inner, schemas = typed_dicts(hints[name]), object_schemas(properties[name])
        if len(inner) != len(schemas):
            found.append(f"{where}.{name}: {len(inner)} TypedDicts for {len(schemas)} object schemas")
            continue
        for sub_type, sub_schema in zip(inner, schemas, strict=True):
            found += mismatches(sub_type, sub_schema, f"{where}.{name}")
    return found


def test_the_config_types_have_the_schemas_keys_at_every_level() -> None:
    schema = yaml.safe_load(SCHEMA.read_text())
    assert mismatches(Config, schema, "config") == []


def test_a_key_the_schema_lacks_is_found() -> None:
    """The check above can fail: a type with a key of its own is reported."""

    class Paths(typing.TypedDict):
        results: str
        prompts: str
        extra: int

    schema = yaml.safe_load(SCHEMA.read_text())["properties"]["paths"]
    assert "paths: only in the type ['extra'], only in the schema []" in mismatches(Paths, schema, "paths")
