"""Content ids for prompts: the same conversation gets the same id on every machine and in every stage."""

from __future__ import annotations

import hashlib
import json
import unicodedata
from typing import Any

from eaglepipe.messages import Message, Tool


def _nfc(value: Any) -> Any:
    # One user types "é" as one code point, another as "e" + accent: both are the same prompt.
    if isinstance(value, str):
        return unicodedata.normalize("NFC", value)
    if isinstance(value, dict):
        return {_nfc(key): _nfc(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_nfc(item) for item in value]
    return value


def canonical_json(value: Any) -> str:
    """JSON text that depends only on the content, not on key order, spacing or Unicode normal form."""
    return json.dumps(_nfc(value), sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def prompt_id(messages: list[Message], tools: list[Tool] | None) -> str:
    """sha256 hex of the canonical `{"messages", "tools"}`: the id of a prompt whose source gives none."""
    payload = canonical_json({"messages": messages, "tools": tools})
    return hashlib.sha256(payload.encode("utf-8")).hexdigest()
