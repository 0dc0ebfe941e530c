"""The loop both engine sides run: one JSON line in per sample, one line out per reply (stdlib only)."""

from __future__ import annotations

import json
from typing import Any, Protocol


class EngineServer(Protocol):
    def replies(self, sample: dict[str, Any]) -> list[dict[str, Any]]: ...


def replay(server: EngineServer, in_path: str, out_path: str) -> None:
    with open(in_path) as inputs, open(out_path, "w") as out:
        for line in inputs:
            for reply in server.replies(json.loads(line)):
                out.write(json.dumps(reply, ensure_ascii=False) + "\n")
