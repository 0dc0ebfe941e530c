"""Config validation: fill defaults from the JSON Schema and report the first problem in one line."""

from __future__ import annotations

import copy
import dataclasses
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, cast

import jsonschema
import yaml
from jsonschema.protocols import Validator

from eaglepipe.config_types import Config, Source
from eaglepipe.errors import EaglepipeError
from eaglepipe.layout import RunLayout


class ConfigError(EaglepipeError, ValueError):
    """A config problem, phrased as one line naming the key and what is allowed."""


def _with_defaults(validator_class: type[Validator]) -> type[Validator]:
    validate_properties = validator_class.VALIDATORS["properties"]

    def set_defaults(validator, properties, instance, schema):
        if isinstance(instance, dict):
            for name, subschema in properties.items():
                if "default" in subschema:
                    instance.setdefault(name, copy.deepcopy(subschema["default"]))
        yield from validate_properties(validator, properties, instance, schema)

    extended: type[Validator] = jsonschema.validators.extend(validator_class, {"properties": set_defaults})
    return extended


_Validator = _with_defaults(jsonschema.Draft202012Validator)


def _coerce_scalar_string(config: dict[str, Any], error: jsonschema.ValidationError) -> bool:
    """Snakemake's `--config key='{"n": 5}'` hands nested values over as strings ('5'): where the schema
    wants a number or a boolean and the string spells one, store it as that. True when it changed."""
    if error.validator != "type" or not isinstance(error.instance, str) or not error.absolute_path:
        return False
    wanted = error.validator_value if isinstance(error.validator_value, list) else [error.validator_value]
    text = error.instance.strip()
    value: Any = None
    if "integer" in wanted and _INTEGER.fullmatch(text):
        value = int(text)
    elif "number" in wanted and _NUMBER.fullmatch(text):
        value = float(text) if any(c in text for c in ".eE") else int(text)
    elif "boolean" in wanted and text.lower() in ("true", "false"):
        value = text.lower() == "true"
    elif "null" in wanted and text.lower() in ("null", "none", "~"):
        return _store(config, list(error.absolute_path), None)
    if value is None:
        return False
    return _store(config, list(error.absolute_path), value)


_INTEGER = re.compile(r"[-+]?\d+")
_NUMBER = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?")


def _store(config: Any, path: list[Any], value: Any) -> bool:
    for part in path[:-1]:
        config = config[part]
    config[path[-1]] = value
    return True


def _key_path(error: jsonschema.ValidationError) -> str:
    return ".".join(str(part) for part in error.absolute_path) or "(top level)"


def _subschema(error: jsonschema.ValidationError) -> Mapping[str, Any]:
    """The (sub)schema that failed: a mapping wherever this module reads it (never `true`/`false`)."""
    return error.schema if isinstance(error.schema, Mapping) else {}


def _describe(error: jsonschema.ValidationError) -> str:
    key = _key_path(error)
    if error.validator == "additionalProperties" and isinstance(error.instance, Mapping):
        properties = _subschema(error).get("properties", {})
        allowed = ", ".join(sorted(properties)) or "none"
        extra = sorted(set(error.instance) - set(properties))
        where = f"{key}." if error.absolute_path else ""
        return f"config key '{where}{extra[0]}' is not allowed here (allowed: {allowed})"
    if error.validator == "required":
        return f"config key '{key}' misses {error.message.split(' is a required')[0]}"
    if error.validator == "enum":
        return f"config key '{key}' = {error.instance!r}: allowed values are {error.validator_value}"
    if error.validator == "oneOf" and isinstance(error.instance, dict):
        # Report the branch that matches the source's own `type`, which is what the user meant.
        for sub in error.context or []:
            branch_type = _subschema(sub).get("properties", {}).get("type", {}).get("const")
            matches_type = branch_type is None or branch_type == error.instance.get("type")
            if matches_type and sub.validator != "const":
                return _describe(sub)
        return f"config key '{key}.type' = {error.instance.get('type')!r}: allowed values are 'jsonl', 'hf'"
    if error.validator == "type" and _spells_wanted_type(error) and len(error.absolute_path) > 1:
        return (
            f"config key '{key}' = {error.instance!r}: {error.message} (nested values given with --config "
            "arrive as strings; put them in a file and pass it with --configfile)"
        )
    return f"config key '{key}' = {error.instance!r}: {error.message}"


def _spells_wanted_type(error: jsonschema.ValidationError) -> bool:
    """Whether a string the schema rejects would be of the wanted type read as YAML ('[a, b]' for a list):
    only then is the --config hint the cause; 'lots' for a number is just a wrong value."""
    if not isinstance(error.instance, str):
        return False
    try:
        parsed = yaml.safe_load(error.instance)
    except yaml.YAMLError:
        return False
    return jsonschema.Draft202012Validator({"type": error.validator_value}).is_valid(parsed)


def validate_config(config: dict[str, Any], schema_path: Path) -> Config:
    """Validate in place (defaults filled) and check what the schema cannot express; a user's config is any
    mapping until the schema has passed it, then the `Config` its defaults make it."""
    schema = yaml.safe_load(schema_path.read_text())
    while True:
        errors = sorted(_Validator(schema).iter_errors(config), key=lambda e: len(list(e.absolute_path)))
        if not any(_coerce_scalar_string(config, error) for error in errors):
            break
    if errors:
        raise ConfigError(_describe(errors[0]))
    missing = [name for name in config["datasets"] if name not in config["sources"]]
    if missing:
        raise ConfigError(
            f"config key 'sources' has no entry for prompt set {missing[0]!r} listed in 'datasets'"
        )
    return cast(Config, config)


def is_local_api(config: Config) -> bool:
    return config["api"]["base_url"] == "local"


def answer_source(config: Config, dataset: str) -> Source:
    """Where the set's answers come from: its entry in `answers.sets`, else the run-wide `answers.source`."""
    answers = config["answers"]
    entry = answers["sets"].get(dataset)
    return Source(entry["source"] if entry else answers["source"])


def sets_answered_by(config: Config, source: Source, datasets: list[str]) -> list[str]:
    """The sets of `datasets` whose answers come from `source`, in order."""
    return [ds for ds in datasets if answer_source(config, ds) is source]


def sets_to_buy(config: Config, datasets: list[str], layout: RunLayout) -> list[str]:
    """The sets of `datasets` still to buy from a real API (the emulator's cost nothing): no responses yet."""
    if is_local_api(config):
        return []
    bought = sets_answered_by(config, Source.OPENROUTER, datasets)
    return [ds for ds in bought if not layout.responses(ds).is_file()]


def section_fields(settings: type, section: Mapping[str, Any]) -> dict[str, Any]:
    """The validated section's values for the settings dataclass's fields of the same name: keys that are
    no field are left out, and a field that is no config key keeps its own default."""
    names = {field.name for field in dataclasses.fields(settings) if field.init}
    return {key: value for key, value in section.items() if key in names}


# The set names the schema refuses (its `datasets` items): the layout's run-wide folders, and `prompts`, where
# a configuration may keep its prompt sets beside them.
RUN_WIDE_FOLDERS = ("drafter", "figures", "logs", "prompts")
_SET_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]*")


def target_outside_datasets(
    target: str, datasets: list[str], layout: RunLayout, config_files: list[Path]
) -> str | None:
    """Why a target in a set's folder cannot be built: its set is not in `datasets`, so no rule makes it
    (Snakemake itself would print only "No rule to produce"); or it is another configuration's file, one
    folder deeper (results/demo/... under the real run's results/). None for any other target."""
    found = layout.classify(target)
    if found is None or found.ds is None or found.kind == "prompt_set" or found.ds in datasets:
        return None
    if found.ds in RUN_WIDE_FOLDERS or not _SET_NAME.fullmatch(found.ds):  # no set could have this name
        return None
    if found.kind == "set_dir" and not found.below:  # the folder itself, which no rule makes
        return None
    if found.kind == "set_dir" and len(found.below) > 1:  # {root}/{another root}/{set or run-wide folder}/...
        return (
            f"{target}: not a file of this configuration, whose results root is {layout.results}/: give the "
            "--workflow-profile or --configfile of the run that writes it (the demo's: --workflow-profile "
            "profiles/local)"
        )
    return (
        f"{target}: {found.ds} is not in `datasets` ({_file_setting('datasets', config_files)}): "
        "add it there, with a `sources` entry"
    )


def _file_setting(key: str, config_files: list[Path]) -> str:
    """The config file whose `key` holds (the last that sets it), to name where to edit it."""
    for path in reversed(config_files):
        try:
            if key in (yaml.safe_load(Path(path).read_text()) or {}):
                return os.path.relpath(path) if Path(path).resolve().is_relative_to(Path.cwd()) else str(path)
        except (OSError, yaml.YAMLError):
            continue
    return "the config"
