"""OpenRouter's published response schemas, as they are, for checking the emulator's answers.

`schemas/openrouter.json` (beside this file) holds, unchanged, the response schemas of the routes the
emulator serves and the components they reference, cut from OpenRouter's OpenAPI description by
`tests/openrouter/extract_published_schemas.py`. Nothing in it is loosened to fit the emulator: where the
emulator differs from the description, the emulator is wrong (or the difference is a documented fault it
injects on purpose, such as a string error code, which is then not validated).
"""

from __future__ import annotations

import json
import re
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema

PUBLISHED = Path(__file__).parent / "schemas" / "openrouter.json"
# The emulator's answers by the name the tests use -> (route, status) of the published response schema.
ANSWERS = {
    "chat_result": ("/chat/completions", "200"),
    "key": ("/key", "200"),
    "models": ("/models", "200"),
    "generation": ("/generation", "200"),
    "generation_content": ("/generation/content", "200"),
    "endpoints": ("/models/{author}/{slug}/endpoints", "200"),
}
STREAM_CHUNK = "chat_chunk"  # one `data:` event of a streamed answer: the ChatStreamChunk component


@cache
def _published() -> dict[str, Any]:
    return json.loads(PUBLISHED.read_text())


@cache
def _validator(route: str, status: str) -> jsonschema.Draft202012Validator:
    published = _published()
    if route == "":
        schema: dict[str, Any] = {"$ref": "#/components/schemas/ChatStreamChunk"}
    else:
        responses = published["responses"][route]
        if status not in responses:
            raise KeyError(f"OpenRouter documents no {status} answer for {route}: {sorted(responses)}")
        schema = dict(responses[status])
    return jsonschema.Draft202012Validator({**schema, "components": published["components"]})


def validate(name: str, instance: Any) -> None:
    """Raise `jsonschema.ValidationError` unless `instance` is what OpenRouter documents for answer `name`."""
    if name == STREAM_CHUNK:
        _validator("", "").validate(instance)
        return
    if name not in ANSWERS:
        raise KeyError(f"no answer {name!r}; known: {', '.join([*ANSWERS, STREAM_CHUNK])}")
    _validator(*ANSWERS[name]).validate(instance)


def validate_error(path: str, status: int, instance: Any) -> None:
    """Raise unless `instance` is the error body OpenRouter documents for `status` at URL path `path`
    (`/api/v1/generation`, `/models/a/b/endpoints`: the route is found by its ending)."""
    for route in _published()["responses"]:
        if re.search(re.sub(r"\\{[^}]+\\}", "[^/]+", re.escape(route)) + "$", path):
            _validator(route, str(status)).validate(instance)
            return
    raise KeyError(f"{path}: not a route the emulator serves")
