"""The failure taxonomy (docs/generation.md, "Failure taxonomy"): every documented shape, answered once by
the emulator, goes through the real client and is filed and handled as its row says; the table, the
client's rows and the emulator's shapes name the same things; and the three behaviours that would break
the real run: throttling from a named provider never trips the breaker, a closed rate-limit window is
waited out by every request, and a complete answer without a `finish_reason` is bought once."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from stage_settings import generation_settings
from support.emulator import running_emulator, shapes

from eaglepipe.openrouter.client import GenerationSummary, generate_set
from eaglepipe.openrouter.journal import load_done
from eaglepipe.openrouter.ledger import read_ledger
from eaglepipe.openrouter.ratelimit import throttle_wait
from eaglepipe.openrouter.taxonomy import FAILURES, shape_named

DOCS = Path(__file__).resolve().parent.parent / "docs" / "generation.md"
MODEL = "moonshotai/kimi-k2.5"
KEPT = (("Chutes", "chutes/int4"), ("Moonshot AI", "moonshotai"))
VERDICTS = {"throttle", "transient", "provider_unusable", "prompt_permanent", "run_stop", "complete"}


@dataclass(frozen=True)
class Row:
    shape: str
    cls: str | None  # None: a complete answer
    verdict: str
    source: str


def documented_rows() -> list[Row]:
    """The taxonomy table of docs/generation.md, as written."""
    text = DOCS.read_text()
    table = text[text.index("## Failure taxonomy") :]
    rows = []
    for line in table.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) != 5 or not cells[0].startswith("`"):
            if rows and not line.startswith("|"):
                break
            continue
        shape, cls, verdict, _, source = cells
        rows.append(Row(shape.strip("`"), None if cls == "-" else cls.strip("`"), verdict, source))
    return rows


ROWS = documented_rows()


def test_the_table_the_client_and_the_emulator_name_the_same_shapes() -> None:
    assert len(ROWS) >= 30
    assert len({row.shape for row in ROWS}) == len(ROWS)
    assert {row.shape for row in ROWS} == set(shapes.NAMES)  # every shape documented, and the emulator's
    for row in ROWS:
        assert row.verdict in VERDICTS, row
        assert row.source and (
            row.source.startswith("guess") or "http" in row.source or "OpenAPI" in row.source
        )
        if row.cls is None:
            assert row.verdict == "complete", row
        else:
            assert shape_named(row.cls).verdict == row.verdict, row  # the code's verdict is the table's
    # Every row of the client's taxonomy is met by some documented shape, so each has a test below.
    assert {shape.name for shape in FAILURES} == {row.cls for row in ROWS if row.cls}


@pytest.fixture(scope="module")
def emulator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    log = tmp_path_factory.mktemp("taxonomy") / "emulator.log"
    args = [
        "--model-id",
        MODEL,
        "--seed",
        "5",
        "--tokens-per-s",
        "0",
        "--latency-s",
        "0",
        "--mean-tokens",
        "24",
        "--length-sigma",
        "0.3",
        "--tokens-per-event",
        "4",
    ]
    with running_emulator(None, extra_args=args, log_path=log) as url:
        yield url


def set_faults(url: str, rules: list[dict[str, Any]]) -> None:
    response = httpx.post(f"{url}/emulator/faults", json=rules)
    assert response.status_code == 200, response.text


def stats(url: str) -> dict[str, Any]:
    return httpx.get(f"{url}/emulator/stats").json()


def prompts(count: int) -> list[dict[str, Any]]:
    return [{"id": f"p{i}", "messages": [{"role": "user", "content": f"question {i}"}]} for i in range(count)]


def generate(url: str, folder: Path, count: int = 1, **fields: Any) -> GenerationSummary:
    settings = generation_settings(
        **{
            "base_url": url,
            "model": MODEL,
            "fingerprint": "f",
            "max_tokens": 64,
            "concurrency": 4,
            "progress": False,
            "request_timeout_s": 1.5,
            "backoff_base_s": 0.05,
            "recovery_wait_s": 0.3,
            "allowed_providers": tuple(name for name, _ in KEPT),
            "endpoint_tags": KEPT,
            "provider_obj": {"only": [tag for _, tag in KEPT], "allow_fallbacks": False},
            **fields,
        }
    )

    async def run() -> GenerationSummary:
        return await generate_set(
            prompts(count),
            settings=settings,
            api_key=None,
            journal_dir=folder,
            ledger_dir=folder,
            dataset="s",
        )

    return anyio.run(run)


# Streamed, each row is in the full suite; the inner loop (make test-fast) takes the plain half.
@pytest.mark.parametrize(
    "stream", [False, pytest.param(True, marks=pytest.mark.slow)], ids=["plain", "streamed"]
)
@pytest.mark.parametrize("row", ROWS, ids=[row.shape for row in ROWS])
def test_each_shape_is_filed_and_handled_as_its_row_says(
    row: Row, stream: bool, emulator: str, tmp_path: Path
) -> None:
    set_faults(emulator, [{"fault": row.shape, "times": 1}])
    before = stats(emulator)
    summary = generate(emulator, tmp_path, stream=stream)
    after = stats(emulator)
    sent = after["requests_received"] - before["requests_received"]
    billed = after["requests_billed"] - before["requests_billed"]
    strikes = summary.breaker["strikes"]
    if row.verdict == "complete":
        assert (summary.done, sent, billed) == (1, 1, 1), summary
        assert summary.errors_by_class == {} and summary.retries == 0
        assert read_ledger(tmp_path).by_outcome == {"kept": 1} or summary.recovered == 1
        record = load_done(tmp_path, "f")["p0"]
        assert record["response"]["finish_reason"] in ("stop", "length")
        if row.shape.startswith("finish_"):
            assert record["response"]["finish_evidence"]["shape"].startswith(row.shape)
        return
    assert summary.errors_by_class == {row.cls: 1}, summary
    shape = shape_named(row.cls or "")
    if row.verdict == "run_stop":
        assert (summary.ended_because, summary.done, sent) == (shape.ended_because, 0, 1)
        assert shape.advice in summary.message
    elif row.verdict == "prompt_permanent":
        assert (summary.done, summary.failed_permanent, sent) == (0, 1, 1)
        assert summary.failures[0]["attempts"] == 1
    else:  # throttle, transient, provider_unusable: retried once, then answered
        assert (summary.done, summary.retries, summary.ended_because) == (1, 1, "all_done"), summary
        assert summary.breaker["dropped"] == {}
        if row.verdict == "provider_unusable" and row.cls == "foreign_provider":
            assert sum(summary.breaker["discarded_from"].values()) == 1 and strikes == {}
        elif row.verdict == "provider_unusable" or row.cls == "provider_server_error":
            assert strikes == {"Chutes": {row.cls: 1}}
        else:
            assert strikes == {}  # throttling and transient faults are never held against a provider


def test_throttling_from_the_only_provider_never_trips_the_breaker(emulator: str, tmp_path: Path) -> None:
    """2000 in flight meet dozens of "temporarily rate-limited upstream" 429s a second; five used to drop
    the only native-INT4 provider and stop the run."""
    only_chutes = {
        "allowed_providers": ("Chutes",),
        "endpoint_tags": (KEPT[0],),
        "provider_obj": {"only": ["chutes/int4"], "allow_fallbacks": False},
    }
    set_faults(emulator, [{"fault": "provider_rate_limited", "times": 40}])
    summary = generate(emulator, tmp_path, count=30, concurrency=30, breaker_strikes=5, **only_chutes)
    assert (summary.ended_because, summary.done) == ("all_done", 30)
    assert summary.errors_by_class == {"provider_rate_limited": 40}
    assert summary.breaker["dropped"] == {} and summary.breaker["strikes"] == {}


def test_a_closed_rate_limit_window_holds_every_new_request_until_it_resets(
    emulator: str, tmp_path: Path
) -> None:
    """The emulator answers every request 429 for the window's second, with the reset in epoch ms and no
    Retry-After. Waiting with exponential backoff per request would send the other prompts into the
    closed window; the client holds them all until the reset instead."""
    set_faults(emulator, [{"fault": "account_rate_limited", "times": 1}])
    started = time.monotonic()
    summary = generate(emulator, tmp_path, count=12, concurrency=1)
    elapsed = time.monotonic() - started
    assert (summary.ended_because, summary.done) == ("all_done", 12)
    assert summary.errors_by_class == {"account_rate_limited": 1}  # nothing else was sent into the window
    assert elapsed >= 0.9


def test_a_provider_that_never_says_finish_reason_is_bought_once_per_prompt(
    emulator: str, tmp_path: Path
) -> None:
    """Every answer with `finish_reason: null` beside `native_finish_reason` (ai-sdk-provider#420): each
    kept at its first purchase, with the evidence in its journal line, none bought again."""
    set_faults(emulator, [{"fault": "finish_native_only", "probability": 1.0}])
    before = stats(emulator)
    summary = generate(emulator, tmp_path, count=20, concurrency=8, stream=True)
    after = stats(emulator)
    assert (summary.done, summary.retries) == (20, 0)
    assert after["requests_billed"] - before["requests_billed"] == 20
    assert read_ledger(tmp_path).by_outcome == {"kept": 20}
    for record in load_done(tmp_path, "f").values():
        assert record["response"]["finish_evidence"]["shape"] == "finish_native_only"


@pytest.mark.parametrize(
    ("headers", "error", "seconds", "source", "window"),
    [
        ({"Retry-After": "3"}, None, 3.0, "retry-after", False),
        ({"Retry-After": "Sun, 06 Dec 2026 00:00:10 GMT"}, None, 10.0, "retry-after", False),
        ({"retry-after-ms": "1500"}, None, 1.5, "retry-after-ms", False),
        # OpenRouter's own window: the reset in epoch milliseconds.
        (
            {"X-RateLimit-Remaining": "0", "X-RateLimit-Reset": "1796515230000"},
            None,
            30.0,
            "x-ratelimit-reset",
            True,
        ),
        (
            {"X-RateLimit-Remaining": "0", "X-RateLimit-Reset": "1796515205"},
            None,
            5.0,
            "x-ratelimit-reset",
            True,
        ),
        # A window with requests left is not what this 429 waits for.
        ({"X-RateLimit-Remaining": "7", "X-RateLimit-Reset": "1796515230000"}, None, None, None, False),
        # The longest wait wins: a window closed for 30 s is not open after Retry-After: 1.
        ({"Retry-After": "1", "X-RateLimit-Reset": "1796515230000"}, None, 30.0, "x-ratelimit-reset", True),
        # A provider's headers, copied into the error.
        (
            {},
            {
                "metadata": {
                    "headers": {"x-ratelimit-remaining-requests": "0", "x-ratelimit-reset-requests": "6m0s"}
                }
            },
            360.0,
            "error.metadata.headers.x-ratelimit-reset-requests",
            True,
        ),
        (
            {},
            {"metadata": {"headers": {"anthropic-ratelimit-requests-reset": "2026-12-06T00:00:20Z"}}},
            20.0,
            "error.metadata.headers.anthropic-ratelimit-requests-reset",
            True,
        ),
        ({}, {"metadata": {"retry_after_seconds": 17, "headers": {"Retry-After": "17"}}}, 17.0, None, False),
        (
            {},
            {"availability": {"retry_after": 40, "retryable": True}},
            40.0,
            "error.availability.retry_after",
            False,
        ),
        ({"Retry-After": "soon"}, None, None, None, False),
    ],
)
def test_every_wait_a_throttle_names_is_read(
    headers: dict[str, str], error: Any, seconds: float | None, source: str | None, window: bool
) -> None:
    now = 1796515200.0  # 2026-12-06 00:00:00 UTC
    wait = throttle_wait(headers, error, now=now)
    if seconds is None:
        assert wait is None
        return
    assert wait is not None and wait.seconds == pytest.approx(seconds) and wait.window == window
    if source is not None:
        assert wait.source == source


def test_the_date_header_is_the_clock_resets_are_read_against() -> None:
    """A reset in epoch ms is measured from the server's own `Date`, not this machine's clock."""
    headers = {"Date": "Sun, 06 Dec 2026 00:00:00 GMT", "X-RateLimit-Reset": "1796515212000"}
    wait = throttle_wait(headers, None)
    assert wait is not None and wait.seconds == pytest.approx(12.0)


def test_the_docs_count_of_rows_by_source_is_the_tables() -> None:
    """The paragraph under the table counts the rows by where they come from; it stays true as rows are
    added."""
    guesses = [row for row in ROWS if row.source.startswith("guess")]
    documented = [
        row for row in ROWS if row not in guesses and re.search(r"openrouter\.ai|OpenAPI", row.source)
    ]
    reported = [row for row in ROWS if row not in guesses and row not in documented]
    paragraph = DOCS.read_text().split("Where the rows come from:")[1].split("\n\n")[0]
    said = {key: int(n) for n, key in re.findall(r"(\d+) (cite OpenRouter|cite only|are guesses)", paragraph)}
    assert said == {
        "cite OpenRouter": len(documented),
        "cite only": len(reported),
        "are guesses": len(guesses),
    }


def test_a_prompt_that_failed_for_good_is_not_asked_again_unless_told(emulator: str, tmp_path: Path) -> None:
    """A content filter bills each time: a rerun skips what an earlier run recorded as failed for good
    (.journal/failed.jsonl), and asks it again only with generation.retry_failed."""
    set_faults(emulator, [{"fault": "content_filter", "times": 1}])
    first = generate(emulator, tmp_path, count=3, concurrency=1)
    assert (first.done, first.failed_permanent) == (2, 1)
    before = stats(emulator)
    again = generate(emulator, tmp_path, count=3, concurrency=1)
    assert (again.resumed, again.failed_permanent, again.done) == (2, 1, 2)
    assert stats(emulator)["requests_received"] == before["requests_received"]
    assert "earlier run's" in again.failures[0]["error"]
    asked = generate(emulator, tmp_path, count=3, concurrency=1, retry_failed=True)
    assert (asked.done, asked.failed_permanent) == (3, 0)
    assert stats(emulator)["requests_received"] == before["requests_received"] + 1
