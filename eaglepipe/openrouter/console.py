"""What a person watching the run sees: a live line on stderr and, at the end, a table per provider."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import TextIO, TypedDict

from eaglepipe.responses import ResponseRecord


class ProviderRow(TypedDict):
    """A provider's line of the summary's `providers` and of the end-of-run table."""

    requests: int
    errors: int
    completion_tokens: int
    seconds: float
    timed_tokens: int
    usd: float
    truncated: int
    empty: int
    tok_s: float
    usd_per_m_tokens: float


@dataclass
class ProviderStats:
    requests: int = 0
    errors: int = 0
    completion_tokens: int = 0
    seconds: float = 0.0
    timed_tokens: int = 0  # of answers whose request time is known (not those rebuilt from stored content)
    usd: float = 0.0
    truncated: int = 0
    empty: int = 0

    def add_response(self, record: ResponseRecord) -> None:
        usage, response = record.get("usage") or {}, record["response"]
        self.requests += 1
        self.completion_tokens += usage.get("completion_tokens") or 0
        if (latency_s := record.get("latency_s")) is not None:
            self.seconds += latency_s
            self.timed_tokens += usage.get("completion_tokens") or 0
        self.usd += usage.get("cost") or 0.0
        self.truncated += response.get("finish_reason") == "length"
        self.empty += not (response.get("content") or response.get("reasoning") or response.get("tool_calls"))

    def row(self) -> ProviderRow:
        """Tokens per second of request time (one stream's speed); dollars per million output tokens."""
        tok_s = self.timed_tokens / self.seconds if self.seconds else 0.0
        per_m = self.usd / self.completion_tokens * 1e6 if self.completion_tokens else 0.0
        return {
            "requests": self.requests,
            "errors": self.errors,
            "completion_tokens": self.completion_tokens,
            "seconds": self.seconds,
            "timed_tokens": self.timed_tokens,
            "usd": self.usd,
            "truncated": self.truncated,
            "empty": self.empty,
            "tok_s": round(tok_s, 1),
            "usd_per_m_tokens": round(per_m, 4),
        }


def provider_table(stats: dict[str, ProviderStats]) -> str:
    header = f"{'provider':<24}{'requests':>9}{'errors':>8}{'tok/s':>9}{'$/M tok':>9}{'trunc':>7}{'empty':>7}"
    lines = [header]
    for name, item in sorted(stats.items()):
        row = item.row()
        lines.append(
            f"{name[:23]:<24}{row['requests']:>9}{row['errors']:>8}{row['tok_s']:>9.1f}"
            f"{row['usd_per_m_tokens']:>9.3f}{row['truncated']:>7}{row['empty']:>7}"
        )
    return "\n".join(lines)


class ProgressLine:
    """Redrawn in place on a terminal. Elsewhere (a log file, a pipe) it writes nothing: the job's logger
    already writes the same line there at a steady interval, and a second copy only doubled each line."""

    def __init__(self, stream: TextIO = sys.stderr) -> None:
        self.stream = stream
        self.live = stream.isatty()

    def show(self, text: str) -> None:
        if self.live:
            self.stream.write("\r\x1b[2K" + text)
            self.stream.flush()

    def close(self, text: str) -> None:
        if self.live:
            self.stream.write("\r\x1b[2K" + text + "\n")
            self.stream.flush()
