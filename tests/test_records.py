"""The typed records' readers (responses.jsonl, the journal, tokens.json): they take files made by hand with
only the keys every reader needs, and refuse anything else with one line naming the file and line."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from eaglepipe.openrouter.errors import OpenRouterError
from eaglepipe.openrouter.journal import FAILED_FILE, RECORDS_FILE, failed_for_good, read_records
from eaglepipe.responses import ResponseError, iter_responses, read_responses, write_responses
from eaglepipe.tokens.token_file import TokenFileError, read_token_stats


def write_lines(path: Path, lines: list[str]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(line + "\n" for line in lines))
    return path


def test_responses_round_trip_through_their_writer_and_reader(tmp_path):
    record = {
        "prompt_id": "p1", "source": "import", "fingerprint": "f", "request": {"model": "m"},
        "response": {"content": "hi", "reasoning": None, "tool_calls": [], "finish_reason": "stop"},
        "provider": "import", "generation_id": None,
        "usage": {"prompt_tokens": 3, "completion_tokens": 1, "reasoning_tokens": None, "cost": None},
        "latency_s": None, "attempts": 0,
    }
    path = tmp_path / "responses.jsonl"
    write_responses([record, {**record, "prompt_id": "p2"}], path)
    assert read_responses(path) == [record, {**record, "prompt_id": "p2"}]
    assert path.read_text().splitlines()[0] == json.dumps(record, ensure_ascii=False)


def test_a_hand_made_responses_file_reads_with_a_prompt_id_alone(tmp_path):
    lines = ['{"prompt_id": "a", "usage": {"completion_tokens": 2}}', ""]
    path = write_lines(tmp_path / "responses.jsonl", lines)
    assert [record["prompt_id"] for record in iter_responses(path)] == ["a"]


@pytest.mark.parametrize(
    ("line", "says"),
    [
        ("not json", "line 2 is not JSON"),
        ('{"usage": {}}', "line 2 has no string `prompt_id`"),
        ('["a"]', "line 2 has no string `prompt_id`"),
        ('{"prompt_id": "b", "response": "text"}', "line 2 has a `response` that is not an object"),
    ],
)
def test_a_line_no_stage_can_read_is_refused_in_one_line(tmp_path, line, says):
    path = write_lines(tmp_path / "responses.jsonl", ['{"prompt_id": "a"}', line])
    with pytest.raises(ResponseError, match=f"^{re.escape(str(path))} {says}") as caught:
        read_responses(path)
    assert "\n" not in str(caught.value)


def test_the_journal_refuses_a_record_without_a_prompt_id(tmp_path):
    write_lines(tmp_path / RECORDS_FILE, ['{"prompt_id": "a", "fingerprint": "f"}', '{"fingerprint": "f"}'])
    with pytest.raises(OpenRouterError, match=f"{RECORDS_FILE} line 2 has no string `prompt_id`"):
        read_records(tmp_path)


def test_permanent_failures_are_read_by_fingerprint_and_checked(tmp_path):
    failure = {"prompt_id": "a", "fingerprint": "f", "class": "content_filter", "status": 403, "error": "no"}
    write_lines(tmp_path / FAILED_FILE, [json.dumps(failure), json.dumps({**failure, "fingerprint": "g"})])
    assert failed_for_good(tmp_path, "f") == {"a": failure}
    write_lines(tmp_path / FAILED_FILE, [json.dumps({"fingerprint": "f"})])
    with pytest.raises(OpenRouterError, match=f"{FAILED_FILE} line 1 has no string `prompt_id`"):
        failed_for_good(tmp_path, "f")


def test_token_stats_read_with_prompt_ids_alone_and_refuse_other_files(tmp_path):
    path = tmp_path / "tokens.json"
    path.write_text(json.dumps({"prompt_ids": ["a", "b"]}))
    assert read_token_stats(path)["prompt_ids"] == ["a", "b"]
    for text, says in (("{", "is not JSON"), ('{"prompt_ids": [1]}', "has no list of string `prompt_ids`"),
                       ("[]", "has no list of string `prompt_ids`")):
        path.write_text(text)
        with pytest.raises(TokenFileError, match=f"^{re.escape(str(path))} {says}: rerun the tokens rule$"):
            read_token_stats(path)
