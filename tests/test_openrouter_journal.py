"""The journal: durable appends that survive cancellation, torn tails dropped, fingerprints kept apart."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import pytest

from eaglepipe.openrouter.errors import OpenRouterError
from eaglepipe.openrouter.fingerprint import request_fingerprint
from eaglepipe.openrouter.journal import (
    RECORDS_FILE,
    TALLY_FILE,
    load_done,
    open_journal,
    read_records,
    tally_done,
)


def record(prompt_id: str, fingerprint: str = "f1") -> dict[str, Any]:
    return {
        "prompt_id": prompt_id,
        "fingerprint": fingerprint,
        "response": {"content": f"answer {prompt_id}"},
    }


def append_all(journal_dir: Path, records: list[dict[str, Any]]) -> None:
    async def write() -> None:
        async with open_journal(journal_dir) as journal:
            for item in records:
                await journal.append(item)

    anyio.run(write)


def test_only_current_fingerprint_is_reused_and_others_stay(tmp_path: Path) -> None:
    append_all(tmp_path, [record("a", "f1"), record("b", "f2"), record("c", "f1")])
    assert sorted(load_done(tmp_path, "f1")) == ["a", "c"]
    assert sorted(load_done(tmp_path, "f2")) == ["b"]
    assert len(read_records(tmp_path)) == 3


def test_torn_last_line_dropped_then_cut_before_next_append(tmp_path: Path) -> None:
    append_all(tmp_path, [record("a")])
    path = tmp_path / RECORDS_FILE
    with open(path, "ab") as handle:
        handle.write(json.dumps(record("b")).encode()[:25])
    assert list(load_done(tmp_path, "f1")) == ["a"]
    append_all(tmp_path, [record("c")])
    assert [json.loads(line)["prompt_id"] for line in path.read_text().splitlines()] == ["a", "c"]


def test_corrupt_middle_line_is_reported_with_its_number(tmp_path: Path) -> None:
    (tmp_path / RECORDS_FILE).write_text(
        json.dumps(record("a")) + "\nnot json\n" + json.dumps(record("b")) + "\n"
    )
    with pytest.raises(OpenRouterError, match="line 2 is not JSON"):
        load_done(tmp_path, "f1")


def test_append_completes_inside_a_cancelled_scope(tmp_path: Path) -> None:
    async def cancelled_write() -> None:
        async with open_journal(tmp_path) as journal:
            with anyio.CancelScope() as scope:
                scope.cancel()
                await journal.append(record("a"))

    anyio.run(cancelled_write)
    assert list(load_done(tmp_path, "f1")) == ["a"]


def test_fingerprint_changes_with_what_shapes_the_response() -> None:
    base = {
        "model": "m",
        "base_url": "http://x/api/v1",
        "provider_obj": {"only": ["a"]},
        "sampling": {"temperature": 1.0, "top_p": 0.95},
        "max_tokens": 16,
        "reasoning": None,
    }
    reference = request_fingerprint(**base)
    assert len(reference) == 16 and int(reference, 16) >= 0
    assert request_fingerprint(**{**base, "base_url": "http://x/api/v1/"}) == reference
    assert (
        request_fingerprint(**{**base, "sampling": {"top_p": 0.95, "temperature": 1.0, "seed": None}})
        == reference
    )
    for change in (
        {"model": "m2"},
        {"base_url": "http://y/api/v1"},
        {"provider_obj": {"only": ["b"]}},
        {"sampling": {"temperature": 0.0, "top_p": 0.95}},
        {"max_tokens": 17},
        {"reasoning": {"effort": "high"}},
        {"response_options": {"return_token_ids": True}},
    ):
        assert request_fingerprint(**{**base, **change}) != reference, change


def usage_record(prompt_id: str, completion: int, fingerprint: str = "f1") -> dict[str, Any]:
    return {**record(prompt_id, fingerprint), "usage": {"prompt_tokens": 7, "completion_tokens": completion}}


def test_the_tally_reads_only_what_was_appended_since_the_last_look(tmp_path: Path) -> None:
    append_all(tmp_path, [usage_record("a", 10), usage_record("b", 20), usage_record("c", 5, "old")])
    assert tally_done(tmp_path, "f1") == {
        "a": {"usage": {"prompt_tokens": 7, "completion_tokens": 10}},
        "b": {"usage": {"prompt_tokens": 7, "completion_tokens": 20}},
    }
    covered = json.loads((tmp_path / TALLY_FILE).read_text())["offset"]
    assert covered == (tmp_path / RECORDS_FILE).stat().st_size

    # Proof that the covered bytes are not read again: spoil them in place (same size, same first line).
    data = (tmp_path / RECORDS_FILE).read_bytes()
    first_end = data.index(b"\n") + 1
    (tmp_path / RECORDS_FILE).write_bytes(data[:first_end] + data[first_end:].replace(b'"b"', b'"X"'))
    append_all(tmp_path, [usage_record("d", 30), usage_record("a", 11)])  # a re-answered: the last one counts
    done = tally_done(tmp_path, "f1")
    assert {pid: r["usage"]["completion_tokens"] for pid, r in done.items()} == {"a": 11, "b": 20, "d": 30}
    assert "X" in load_done(tmp_path, "f1")  # a full read sees the spoiled bytes; the tally never reread them


def test_a_replaced_or_torn_journal_is_tallied_from_its_start(tmp_path: Path) -> None:
    append_all(tmp_path, [usage_record("a", 10), usage_record("b", 20)])
    assert sorted(tally_done(tmp_path, "f1")) == ["a", "b"]
    (tmp_path / RECORDS_FILE).unlink()
    append_all(tmp_path, [usage_record("z", 1)])
    assert sorted(tally_done(tmp_path, "f1")) == ["z"]
    with open(tmp_path / RECORDS_FILE, "ab") as handle:  # a writer killed mid-line
        handle.write(b'{"prompt_id": "half')
    assert sorted(tally_done(tmp_path, "f1")) == ["z"]
    (tmp_path / TALLY_FILE).write_text("not json")  # a lost cache costs one full read, nothing else
    assert sorted(tally_done(tmp_path, "f1")) == ["z"]
    assert tally_done(tmp_path / "missing", "f1") == {}
