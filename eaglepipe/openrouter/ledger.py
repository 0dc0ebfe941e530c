"""The run-wide ledger: every billed request of every generation job, so `budget.usd` holds for the run.

`{results}/.ledger/ledger.jsonl` (one per results root) is append-only and shared by all generation
jobs (flock per write). Lines:
- `{"event": "started", "set", "prompt_id", "generation_id", "fingerprint", "at"}`: a request got its
  generation id, so if the job dies now the request can still be found and charged later (and its stored
  text journaled, when `/generation/content` has it and it was asked under the same fingerprint);
- `{"event": "billed", "set", "prompt_id", "generation_id", "usd", "completion_tokens", "outcome",
  "provider", "at"}` (and `cause`, the failure taxonomy's class, for a failed request this job saw fail) with
  outcome `kept` (in the journal), `discarded` (served outside the allowlist),
  `error` (a failure that carried a cost, or none: it closes its `started` line), `recovered` (in flight
  at a kill, cut off or without a cost, charged per `GET /generation`), `recovered_content` (the same,
  and its text from `/generation/content` journaled) or `not_found` (never found there: assumed unbilled).
A `started` line without a `billed` line for its generation id is *unresolved*.

`{results}/.ledger/live/{set}.json` is each running job's heartbeat (in flight, expected dollars in flight):
other jobs read them to split the concurrency and to keep what is in flight elsewhere out of their own
dollar headroom.
"""

from __future__ import annotations

import json
import os
import socket
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, NotRequired, TypedDict, cast

from eaglepipe.io import atomic_write
from eaglepipe.openrouter.appendlog import AppendLog, read_lines, read_new_lines

LEDGER_FILE = "ledger.jsonl"
LIVE_DIR = "live"
# A heartbeat older than this is a job that died without removing it (kill -9, lost node).
HEARTBEAT_STALE_S = 15.0


class StartedLine(TypedDict):
    """A request got its generation id; unresolved until a BilledLine names that id."""

    event: Literal["started"]
    set: str
    prompt_id: str
    generation_id: str
    fingerprint: str | None
    at: float


class BilledLine(TypedDict):
    event: Literal["billed"]
    set: str
    prompt_id: str
    generation_id: str | None
    usd: float
    completion_tokens: int | None
    outcome: str
    provider: str | None
    at: float
    cause: NotRequired[str]


class HeartbeatState(TypedDict):
    """A running job's `live/{set}.json`."""

    pid: int
    host: str
    updated_at: float
    in_flight: int
    expected_usd_in_flight: float


def ledger_path(ledger_dir: Path) -> Path:
    return Path(ledger_dir) / LEDGER_FILE


@dataclass
class LedgerView:
    """What the ledger says so far, kept current by reading only the bytes added since the last look."""

    path: Path
    offset: int = 0
    usd: float = 0.0
    billed: int = 0
    usd_by_set: dict[str, float] = field(default_factory=dict)
    by_outcome: dict[str, int] = field(default_factory=dict)
    resolved: set[str] = field(default_factory=set)
    # `started` lines not billed yet, by set and generation id, in ledger order: admissions count a set's
    # without a pass over every set's.
    unresolved_by_set: dict[str, dict[str, StartedLine]] = field(default_factory=dict)

    def refresh(self) -> LedgerView:
        records, self.offset = read_new_lines(self.path, self.offset)
        for record in records:
            generation_id = record.get("generation_id")
            if record.get("event") == "started":
                if generation_id and generation_id not in self.resolved:
                    line = cast(StartedLine, record)  # a line this module wrote
                    self.unresolved_by_set.setdefault(record.get("set", ""), {})[generation_id] = line
                continue
            usd = float(record.get("usd") or 0.0)
            self.usd += usd
            self.billed += 1
            dataset = record.get("set", "")
            self.usd_by_set[dataset] = self.usd_by_set.get(dataset, 0.0) + usd
            outcome = record.get("outcome", "")
            self.by_outcome[outcome] = self.by_outcome.get(outcome, 0) + 1
            if generation_id:
                self.resolved.add(generation_id)
                for started in self.unresolved_by_set.values():
                    if started.pop(generation_id, None) is not None:
                        break
        return self

    @property
    def unresolved(self) -> dict[str, StartedLine]:
        """Every set's unresolved requests, by generation id."""
        return {key: record for started in self.unresolved_by_set.values() for key, record in started.items()}

    def unresolved_of(self, dataset: str) -> list[StartedLine]:
        return list(self.unresolved_by_set.get(dataset, {}).values())

    def unresolved_count_of(self, dataset: str, excluding: set[str]) -> int:
        """How many of `dataset`'s unresolved requests are not in `excluding`, without a Python loop."""
        ids = self.unresolved_by_set.get(dataset, {}).keys()
        return len(ids) - len(ids & excluding)


def read_ledger(ledger_dir: Path) -> LedgerView:
    return LedgerView(ledger_path(ledger_dir)).refresh()


def read_billed(ledger_dir: Path) -> list[BilledLine]:
    """The ledger's `billed` lines in time order (a torn last line, a job killed mid-write, is skipped)."""
    billed = [
        cast(BilledLine, record)  # a line this module wrote
        for record in read_lines(ledger_path(ledger_dir))
        if record.get("event") == "billed"
    ]
    return sorted(billed, key=lambda record: record.get("at") or 0.0)


class RunLedger:
    """One generation job's side of the ledger: `async with RunLedger(ledger_dir, "B3") as ledger`."""

    def __init__(self, ledger_dir: Path, dataset: str) -> None:
        self.dataset = dataset
        self.view = LedgerView(ledger_path(ledger_dir))
        # This job's own billed lines, for its summary.
        self.outcomes: Counter[str] = Counter()
        self.usd_billed = 0.0
        self._log = AppendLog(ledger_path(ledger_dir), shared=True)

    async def __aenter__(self) -> RunLedger:
        await self._log.__aenter__()
        self.view.refresh()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self._log.__aexit__(*exc)

    async def flush(self) -> None:
        """Until every line handed over, those written behind included, is on disk."""
        await self._log.flush()

    async def started(self, prompt_id: str, generation_id: str, fingerprint: str | None = None) -> None:
        line: StartedLine = {
            "event": "started",
            "set": self.dataset,
            "prompt_id": prompt_id,
            "generation_id": generation_id,
            "fingerprint": fingerprint,
            "at": round(time.time(), 3),
        }
        await self._log.append(line)

    async def ensure_started(self, prompt_id: str, generation_id: str) -> None:
        """An answer whose cost is not known yet (no usage chunk, `cost: null`) stays unresolved, to be
        priced by `/generation`, rather than booked at $0; a plain request has no `started` line yet. No
        fingerprint: the answer is journaled already, its text needs no recovery."""
        self.view.refresh()
        if generation_id not in self.view.unresolved and generation_id not in self.view.resolved:
            await self.started(prompt_id, generation_id)

    async def billed(
        self,
        prompt_id: str,
        generation_id: str | None,
        *,
        usd: float,
        outcome: str,
        completion_tokens: int | None = None,
        provider: str | None = None,
        journaled: bool = False,
        cause: str | None = None,
    ) -> None:
        """`journaled`: the answer's journal record, which holds its generation id and cost, is on disk
        already, so the line is written behind without waiting (a start after a kill bills journaled
        answers the ledger lacks); until it is written the request stays unresolved, held at worst case.
        `cause`: why a request that was not kept failed (the failure taxonomy's class), when known."""
        self.outcomes[outcome] += 1
        self.usd_billed += usd
        line: BilledLine = {
            "event": "billed",
            "set": self.dataset,
            "prompt_id": prompt_id,
            "generation_id": generation_id,
            "usd": usd,
            "completion_tokens": completion_tokens,
            "outcome": outcome,
            "provider": provider,
            "at": round(time.time(), 3),
        }
        if cause is not None:
            line["cause"] = cause
        if journaled:
            self._log.append_behind(line)
        else:
            await self._log.append(line)


@dataclass(frozen=True)
class OtherJobs:
    """The generation jobs running beside this one, as their heartbeats last said."""

    count: int = 0
    in_flight: int = 0
    expected_usd_in_flight: float = 0.0


class Heartbeat:
    """This job's heartbeat file, and the reading of everyone else's."""

    def __init__(self, ledger_dir: Path, dataset: str) -> None:
        self.folder = Path(ledger_dir) / LIVE_DIR
        self.path = self.folder / f"{dataset}.json"
        self.host = socket.gethostname()

    def beat(self, in_flight: int, expected_usd_in_flight: float) -> None:
        state: HeartbeatState = {
            "pid": os.getpid(),
            "host": self.host,
            "updated_at": time.time(),
            "in_flight": in_flight,
            "expected_usd_in_flight": expected_usd_in_flight,
        }
        self.folder.mkdir(parents=True, exist_ok=True)
        atomic_write(self.path, lambda tmp: tmp.write_text(json.dumps(state)))

    def others(self) -> OtherJobs:
        count, in_flight, usd = 0, 0, 0.0
        for path in sorted(self.folder.glob("*.json")):
            if path == self.path:
                continue
            try:
                state = json.loads(path.read_text())
            except (OSError, ValueError):
                continue  # removed or being replaced right now
            if not self._alive(state):
                continue
            count += 1
            in_flight += int(state.get("in_flight") or 0)
            usd += float(state.get("expected_usd_in_flight") or 0.0)
        return OtherJobs(count, in_flight, usd)

    def remove(self) -> None:
        self.path.unlink(missing_ok=True)

    def _alive(self, state: HeartbeatState) -> bool:
        if time.time() - float(state.get("updated_at") or 0) > HEARTBEAT_STALE_S:
            return False
        if state.get("host") != self.host:
            return True
        pid = int(state.get("pid") or 0)
        if pid <= 0:
            return False
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
