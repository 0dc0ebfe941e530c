"""Reading prompt records from a local JSONL file or a Hugging Face dataset.

A local file is the user's own: its first bad line stops the build with that line's number. A dataset is
someone else's: rows that fail validation are skipped and counted, since the user cannot fix them.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eaglepipe.prompts.validate import CheckedRecord, PromptError, validate_record

HF_KEYS = (
    "type",
    "name",
    "config",
    "split",
    "revision",
    "data_files",
    "format",
    "field",
    "prompt_field",
    "sample",
)
SHAREGPT_ROLES = {
    "human": "user",
    "gpt": "assistant",
    "system": "system",
    "tool": "tool",
    "observation": "tool",
    "function_call": "assistant",
}


@dataclass(frozen=True)
class SourcedRecord:
    """A validated record and where it came from, kept until ids are checked so a clash can name both."""

    record: CheckedRecord
    where: str
    stripped_trailing_assistant: bool = False


@dataclass(frozen=True)
class SkippedRow:
    """A dataset row that failed validation, with the one-line reason."""

    where: str
    reason: str


def _sourced(obj: Any, *, where: str, strip_trailing_assistant: bool) -> SourcedRecord:
    record = validate_record(obj, where=where, strip_trailing_assistant=strip_trailing_assistant)
    # Validation never drops a message, so a shorter list means trailing assistant turns were removed.
    stripped = len(record["messages"]) < len(obj["messages"])
    return SourcedRecord(record, where, stripped)


def _lines(path: Path) -> list[str]:
    try:  # split on "\n" only: a raw U+2028 inside a JSON string is not a line break
        return path.read_text(encoding="utf-8").split("\n")
    except FileNotFoundError:
        raise PromptError(f"{path}: no such file; check the set's `source.path` in the config") from None
    except UnicodeDecodeError as error:
        raise PromptError(f"{path}: not UTF-8 (byte {error.start}); save the file as UTF-8") from None


def load_jsonl(path: Path, *, strip_trailing_assistant: bool) -> list[SourcedRecord]:
    """Every record of a JSONL prompt file; blank lines are skipped, the first bad line raises."""
    records = []
    for number, line in enumerate(_lines(path), 1):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as error:
            raise PromptError(
                f"{where}: not valid JSON ({error.msg}, column {error.colno}); fix the line"
            ) from None
        records.append(_sourced(obj, where=where, strip_trailing_assistant=strip_trailing_assistant))
    return records


def _decoded_tools(row: dict, *, where: str) -> Any:
    tools = row.get("tools")
    if not isinstance(tools, str):
        return tools
    try:  # datasets often store the declarations as a JSON string column
        return json.loads(tools) if tools.strip() else None
    except json.JSONDecodeError:
        raise PromptError(f"{where}: the `tools` column is not valid JSON") from None


def _sharegpt_messages(turns: Any, *, where: str) -> list[dict]:
    if not isinstance(turns, list):
        raise PromptError(f"{where}: a sharegpt conversation must be a list of {{from, value}} turns")
    messages = []
    for number, turn in enumerate(turns, 1):
        speaker = turn.get("from") if isinstance(turn, dict) else None
        if speaker not in SHAREGPT_ROLES:
            raise PromptError(
                f"{where}: turn {number} has from={speaker!r}, not one of {', '.join(SHAREGPT_ROLES)}"
            )
        messages.append({"role": SHAREGPT_ROLES[speaker], "content": turn.get("value")})
    return messages


def _hf_options(source: dict) -> tuple[str, str, int | None]:
    unknown = sorted(set(source) - set(HF_KEYS))
    if unknown:
        raise PromptError(
            f"hf source: unknown key(s) {', '.join(unknown)}; the known keys are {', '.join(HF_KEYS)}"
        )
    name, split, sample = source.get("name"), source.get("split", "train"), source.get("sample")
    if not isinstance(name, str) or not name:
        raise PromptError(
            "hf source: `name` is required (a hub dataset id, a local folder, or json/parquet + data_files)"
        )
    if not isinstance(split, str):
        raise PromptError(f"hf source {name!r}: `split` must be a string such as train")
    if source.get("format", "openai") not in ("openai", "sharegpt"):
        raise PromptError(
            f"hf source {name!r}: `format` must be openai or sharegpt, not {source['format']!r}"
        )
    if "prompt_field" in source and ("format" in source or "field" in source):
        raise PromptError(
            f"hf source {name!r}: `prompt_field` builds single-turn prompts; drop `format` and `field`"
        )
    if sample is not None and (isinstance(sample, bool) or not isinstance(sample, int) or sample < 1):
        raise PromptError(f"hf source {name!r}: `sample` must be a positive integer, not {sample!r}")
    return name, split, sample


def _column(source: dict) -> str:
    if "prompt_field" in source:
        return source["prompt_field"]
    return source.get("field") or ("conversations" if source.get("format") == "sharegpt" else "messages")


def _row_record(source: dict, row: dict, column: str, *, where: str) -> dict:
    if "prompt_field" in source:
        return {"messages": [{"role": "user", "content": row[column]}]}
    if source.get("format") == "sharegpt":
        messages = _sharegpt_messages(row[column], where=where)
    else:
        messages = row[column]
    return {"messages": messages, "tools": _decoded_tools(row, where=where)}


def _first_line(error: Exception) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def _read_rows(
    rows: Iterable[dict],
    source: dict,
    *,
    where_prefix: str,
    sample: int | None,
    strip_trailing_assistant: bool,
) -> list[SourcedRecord | SkippedRow]:
    column = _column(source)
    loaded: list[SourcedRecord | SkippedRow] = []
    valid = 0
    for number, row in enumerate(rows):
        if sample is not None and valid >= sample:
            break
        where = f"{where_prefix}:{number}"
        if column not in row:  # a config error, not a bad row: every row would fail the same way
            raise PromptError(
                f"{where}: no column {column!r} (columns: {', '.join(row)}); set `field` or `prompt_field`"
            )
        try:
            obj = _row_record(source, row, column, where=where)
            loaded.append(_sourced(obj, where=where, strip_trailing_assistant=strip_trailing_assistant))
            valid += 1
        except PromptError as error:
            loaded.append(SkippedRow(where, str(error)))
    return loaded


def load_hf(source: dict, *, strip_trailing_assistant: bool) -> list[SourcedRecord | SkippedRow]:
    """Rows of a dataset split in dataset order, invalid ones as `SkippedRow`.

    With `sample`, reading stops after that many valid rows and the split is streamed, so a large dataset
    costs only the rows used and the same config always yields the same prompts.
    """
    import datasets

    name, split, sample = _hf_options(source)
    try:
        rows = datasets.load_dataset(
            name,
            source.get("config"),
            split=split,
            revision=source.get("revision"),
            data_files=source.get("data_files"),
            streaming=sample is not None,
        )
        return _read_rows(
            rows,
            source,
            where_prefix=f"{name}[{split}]",
            sample=sample,
            strip_trailing_assistant=strip_trailing_assistant,
        )
    except PromptError:
        raise
    except (OSError, ValueError, StopIteration, datasets.exceptions.DatasetsError) as error:
        # datasets raises a bare StopIteration when `data_files` match no file its builder can read
        reason = "no readable data file" if isinstance(error, StopIteration) else _first_line(error)
        raise PromptError(
            f"hf source {name!r}: cannot read split {split!r} ({reason}); check name/config/split/data_files"
        ) from None
