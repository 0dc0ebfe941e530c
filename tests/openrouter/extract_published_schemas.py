"""Copy, unchanged, the parts of OpenRouter's OpenAPI description the emulator must satisfy.

    python tests/openrouter/extract_published_schemas.py OPENAPI.yaml \
        tests/support/schemas/openrouter.json

Writes each response schema the emulator serves (by path, method, status and content type) and every
component they reference, transitively, exactly as published; nothing is loosened or tightened. Rerun
it on a newer description to see, through the emulator's tests, what changed.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import yaml

SERVED = {  # path -> methods; the emulator's routes
    "/chat/completions": "post",
    "/key": "get",
    "/models": "get",
    "/generation": "get",
    "/generation/content": "get",
    "/models/{author}/{slug}/endpoints": "get",
}
STREAM_CHUNK = "ChatStreamChunk"  # one `data:` event of a streamed answer


def references(node: Any) -> set[str]:
    if isinstance(node, dict):
        found = {node["$ref"].rsplit("/", 1)[-1]} if isinstance(node.get("$ref"), str) else set()
        return found.union(*(references(v) for k, v in node.items() if k != "$ref"))
    if isinstance(node, list):
        return set().union(*(references(v) for v in node))
    return set()


def extract(spec: dict[str, Any]) -> dict[str, Any]:
    schemas = spec["components"]["schemas"]
    responses: dict[str, dict[str, Any]] = {}
    for path, method in SERVED.items():
        for status, response in spec["paths"][path][method]["responses"].items():
            for content_type, body in response.get("content", {}).items():
                if content_type == "application/json":
                    responses.setdefault(path, {})[str(status)] = body["schema"]
    wanted, todo = set(), [STREAM_CHUNK, *references(responses)]
    while todo:
        name = todo.pop()
        if name not in wanted:
            wanted.add(name)
            todo.extend(references(schemas[name]))
    return {
        "source": f"OpenRouter's OpenAPI {spec.get('openapi')} description {spec['info'].get('version')}",
        "responses": responses,
        "components": {"schemas": {name: schemas[name] for name in sorted(wanted)}},
    }


def main() -> None:
    spec_path, out = Path(sys.argv[1]), Path(sys.argv[2])
    published = extract(yaml.safe_load(spec_path.read_text()))
    out.write_text(json.dumps(published, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
