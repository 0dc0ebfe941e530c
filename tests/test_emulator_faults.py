"""Injected faults (`--faults`) as a raw HTTP client sees them, and the checks on a faults file."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from support.api_schemas import validate, validate_error
from support.emulator import import_path, running_emulator
from support.emulator.fault_plan import load_faults

from eaglepipe.emulator.errors import EmulatorError

MODEL_ID = "local/smollm2-135m-instruct"
FAST = ["--latency-s", "0", "--tokens-per-s", "0", "--mean-tokens", "20", "--length-sigma", "0.3"]
STALL_S = 0.25  # far above a local answer's few milliseconds
MIXED_FAULTS = f"""
- {{fault: status, status: 429, probability: 0.1, retry_after_s: 1.5, code: capacity_exhausted}}
- {{fault: status, status: 502, probability: 0.05}}
- {{fault: error_in_200, probability: 0.1}}
- {{fault: midstream_error, probability: 0.1, after_tokens: 3}}
- {{fault: empty_choices, probability: 0.1}}
- {{fault: reset, probability: 0.1}}
- {{fault: stall, probability: 0.05, seconds: {STALL_S}}}
- {{fault: wrong_provider, probability: 0.1}}
"""
ONLY_CHUTES = {"only": ["chutes"]}


def body(stream: bool) -> dict:
    return {
        "model": MODEL_ID,
        "messages": [{"role": "user", "content": "Hello"}],
        "provider": ONLY_CHUTES,
        "stream": stream,
    }


@pytest.fixture(scope="module")
def faulty(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """(base URL, log) of a server with every fault kind in MIXED_FAULTS."""
    folder = tmp_path_factory.mktemp("faults")
    (folder / "faults.yaml").write_text(MIXED_FAULTS)
    args = [*FAST, "--faults", str(folder / "faults.yaml"), "--fault-seed", "3"]
    with running_emulator(None, extra_args=args, log_path=folder / "emulator.log") as url:
        yield url, folder / "emulator.log"


def plain_outcome(http: httpx.Client) -> tuple[str, dict | None]:
    """What one non-streamed request met: (kind, body of a billed answer)."""
    started = time.monotonic()
    try:
        response = http.post("/chat/completions", json=body(stream=False))
    except httpx.RemoteProtocolError:
        return "reset", None
    elapsed_s = time.monotonic() - started
    answer = response.json()
    if response.status_code == 429:
        assert response.headers["retry-after"] == "2"  # 1.5 s, rounded up to whole seconds
        error = answer["error"]
        assert error["availability"] == {"retry_after": 1.5, "retryable": True}
        assert (error["metadata"]["retry_after"], error["metadata"]["reason"]) == (1.5, "capacity_exhausted")
    if response.status_code != 200:
        validate_error(response.url.path, response.status_code, answer)
        assert answer["error"]["code"] == response.status_code
        return f"status {response.status_code}", None
    if not answer["choices"]:
        assert answer["usage"]["cost"] == 0
        return "empty_choices", None
    choice = answer["choices"][0]
    if choice["finish_reason"] == "error":
        assert choice["error"]["code"] == 502 and answer["usage"]["cost"] == 0
        return "error_in_200", None
    validate("chat_result", answer)
    if answer["provider"] != "Chutes":
        return "wrong_provider", answer
    # Only its wait marks a stalled plain answer, and a loaded machine can slow any answer as much:
    # "stall" here is an upper bound on the stalls this request met.
    return ("stall" if elapsed_s >= STALL_S else "none"), answer


def streamed_outcome(http: httpx.Client) -> tuple[str, dict | None]:
    """What one streamed request met: (kind, its usage chunk when billed)."""
    started = time.monotonic()
    try:
        with http.stream("POST", "/chat/completions", json=body(stream=True)) as response:
            lines = [line for line in response.iter_lines() if line]
    except httpx.RemoteProtocolError:
        return "reset", None
    elapsed_s = time.monotonic() - started
    if response.status_code != 200:
        return f"status {response.status_code}", None
    assert lines[0] == ": OPENROUTER PROCESSING" and lines[-1] == "data: [DONE]"
    comments = [line for line in lines if line.startswith(":")]
    assert comments == lines[: len(comments)]  # keep-alive comments come before the first chunk
    chunks = [json.loads(line.removeprefix("data: ")) for line in lines[len(comments) : -1]]
    failed = [chunk for chunk in chunks if "error" in chunk]
    if failed:
        assert failed == chunks[-1:] and failed[0]["choices"][0]["finish_reason"] == "error"
        assert failed[0]["error"]["code"] == 502
        return ("midstream_error" if len(chunks) > 1 else "error_in_200"), None
    if len(chunks) == 1:
        assert chunks[0]["choices"] == [] and chunks[0]["usage"]["cost"] == 0
        return "empty_choices", None
    usage_chunk = chunks[-1]
    if usage_chunk["provider"] != "Chutes":
        return "wrong_provider", usage_chunk
    stalled = len(comments) > 1  # a stalled stream keeps the connection alive with comments
    assert elapsed_s >= STALL_S or not stalled
    return ("stall" if stalled else "none"), usage_chunk


@pytest.mark.slow
def test_every_fault_kind_reaches_a_raw_client_and_is_counted(faulty: tuple[str, Path]) -> None:
    url, log = faulty
    with httpx.Client(base_url=url) as http:
        endpoints = http.get(f"/models/{MODEL_ID}/endpoints").json()["data"]["endpoints"]
        plain = [plain_outcome(http) for _ in range(150)]
        streamed = [streamed_outcome(http) for _ in range(150)]
        stats = http.get("/emulator/stats").json()
        stray = next(billed for kind, billed in plain if kind == "wrong_provider")
        record = http.get("/generation", params={"id": stray["id"]}).json()["data"]
    seen_plain, seen_streamed = Counter(k for k, _ in plain), Counter(k for k, _ in streamed)
    kinds = {"status 429", "status 502", "error_in_200", "empty_choices", "reset", "stall", "wrong_provider"}
    assert set(seen_plain) == kinds | {"none"}  # not streamed, a midstream error is an error in a 200
    assert set(seen_streamed) == kinds | {"none", "midstream_error"}
    seen, faults = seen_plain + seen_streamed, stats["faults"]
    assert faults["status"] == seen["status 429"] + seen["status 502"]
    for kind in ("empty_choices", "reset", "wrong_provider"):
        assert faults[kind] == seen[kind], kind
    assert seen_streamed["stall"] < faults["stall"] <= seen["stall"]  # the rest stalled plain requests
    assert (
        faults["error_in_200"] + faults["midstream_error"] == seen["error_in_200"] + seen["midstream_error"]
    )
    assert faults["midstream_error"] > seen["midstream_error"]  # the rest hit plain requests
    billed = [answer for _, answer in plain + streamed if answer is not None]
    assert stats["requests_billed"] == len(billed)  # faults that end in an error or nothing cost nothing
    assert stats["usd_charged"] == pytest.approx(sum(b["usage"]["cost"] for b in billed), rel=1e-9)
    assert stats["in_flight"] == 0

    # a misrouted answer is billed at the prices of the endpoint that served it, and reported so
    served = [e for e in endpoints if e["provider_name"] == stray["provider"]]
    usage = stray["usage"]
    assert any(
        usage["cost"]
        == pytest.approx(
            usage["prompt_tokens"] * float(e["pricing"]["prompt"])
            + usage["completion_tokens"] * float(e["pricing"]["completion"])
        )
        for e in served
    )
    assert record["provider_name"] == stray["provider"] and record["total_cost"] == usage["cost"]
    assert "Traceback" not in log.read_text()  # resets on purpose are not logged as server errors


def test_a_burst_answers_429_to_everything_inside_its_window(tmp_path: Path) -> None:
    (tmp_path / "burst.json").write_text(
        json.dumps(
            [{"fault": "burst", "status": 429, "every_s": 0.6, "duration_s": 0.3, "retry_after_s": 0.5}]
        )
    )
    args = [*FAST, "--faults", str(tmp_path / "burst.json")]
    with (
        running_emulator(None, extra_args=args, log_path=tmp_path / "log") as url,
        httpx.Client(base_url=url) as http,
    ):
        replies = []
        for _ in range(45):
            replies.append(http.post("/chat/completions", json=body(stream=False)))
            time.sleep(0.03)
        stats = http.get("/emulator/stats").json()
    statuses = [reply.status_code for reply in replies]
    switches = sum(a != b for a, b in zip(statuses, statuses[1:], strict=False))
    assert set(statuses) == {200, 429} and switches >= 3  # storms and calm spells take turns
    assert all(reply.headers["retry-after"] == "1" for reply in replies if reply.status_code == 429)
    assert stats["faults"] == {"burst": statuses.count(429)} and stats["errors"] == {
        "429": statuses.count(429)
    }


def one_outcome(http: httpx.Client, stream: bool) -> tuple[str, str]:
    """(what the client saw, the generation id) of one request against UNPRICED."""
    usage: dict | None = None
    try:
        if stream:
            with http.stream("POST", "/chat/completions", json=body(stream=True)) as response:
                generation_id = response.headers["x-generation-id"]
                for line in response.iter_lines():
                    chunk = json.loads(line[5:]) if line.startswith("data: {") else {}
                    if "error" in chunk:
                        return "error", generation_id
                    usage = chunk.get("usage") or usage
        else:
            with http.stream("POST", "/chat/completions", json=body(stream=False)) as response:
                generation_id = response.headers["x-generation-id"]
                answer = json.loads(response.read())
            if answer["choices"][0]["finish_reason"] == "error":
                return "error", generation_id
            usage = answer.get("usage")
    except httpx.RemoteProtocolError:
        return "cut", generation_id
    if usage is None:
        return "no_usage", generation_id
    return ("null_cost" if usage["cost"] is None else "priced"), generation_id


def test_unpriced_and_cut_answers_are_billed_and_told_by_generation_and_its_content(tmp_path: Path) -> None:
    """Answers without usage or with `cost: null`, and cut connections whose answers run out, are billed:
    `/generation` gives each cost (and they add up to the charges), `/generation/content` the whole text of
    a cut answer, and a stored error for one that failed, in OpenRouter's published shapes."""
    (tmp_path / "faults.yaml").write_text(
        "- {fault: no_usage, probability: 0.2}\n- {fault: null_cost, probability: 0.2}\n"
        "- {fault: cutoff, probability: 0.3, after_tokens: 2}\n- {fault: midstream_error, probability: 0.2}\n"
    )
    args = [*FAST, "--faults", str(tmp_path / "faults.yaml"), "--store-content"]
    with (
        running_emulator(None, extra_args=args, log_path=tmp_path / "log") as url,
        httpx.Client(base_url=url) as http,
    ):
        outcomes = [(*one_outcome(http, stream), stream) for stream in [True, False] * 30]
        # A plain answer carrying an error is not recorded (nothing ran: the error stands for the answer).
        known = [(kind, gid) for kind, gid, stream in outcomes if stream or kind != "error"]
        time.sleep(0.2)  # a cut stream's answer is run out after the client left
        records = {gid: http.get("/generation", params={"id": gid}).json() for _, gid in known}
        contents = {gid: http.get("/generation/content", params={"id": gid}).json() for _, gid in known}
        stats = http.get("/emulator/stats").json()
    seen = Counter(kind for kind, _, _ in outcomes)
    assert set(seen) == {"no_usage", "null_cost", "cut", "error", "priced"}
    assert (
        stats["faults"]["cutoff"] == seen["cut"] and stats["requests_billed"] == len(outcomes) - seen["error"]
    )
    assert any(kind == "error" for kind, _ in known)
    for kind, gid in known:
        record, content = records[gid]["data"], contents[gid]
        validate("generation", records[gid])
        validate("generation_content", content)
        assert (record["total_cost"] > 0) == (kind != "error")
        assert (content["data"]["error"] is not None) == (kind == "error")
        if kind == "cut":
            assert record["finish_reason"] in ("stop", "length") and content["data"]["output"]["completion"]
    assert stats["usd_charged"] == pytest.approx(sum(r["data"]["total_cost"] for r in records.values()))
    assert "Traceback" not in (tmp_path / "log").read_text()


BAD_FILES = [
    ("{fault: reset}", r"bad\.yaml: expected a list"),
    (
        "[{fault: reset, probability: 0.1}, {fault: explode, probability: 0.1}]",
        r"bad\.yaml: faults\[1\]: unknown fault kind 'explode'",
    ),
    (
        "[{fault: reset, probability: 0.1, seconds: 2}]",
        r"faults\[0\]: unknown key 'seconds' for a reset rule",
    ),
    ("[{fault: stall, probability: 0.1}]", r"faults\[0\]: a stall rule needs 'seconds'"),
    (
        "[{fault: status, status: 200, probability: 0.1}]",
        r"faults\[0\]: status must be an integer between 400",
    ),
    ("[{fault: reset, probability: 1.5}]", r"faults\[0\]: probability must be a number between 0 and 1"),
    ("[{fault: reset, probability: true}]", r"faults\[0\]: probability must be a number"),
    ("[{fault: burst, status: 429, every_s: 1, duration_s: 2}]", r"faults\[0\]: duration_s \(2\) exceeds"),
    ("[{fault: status, status: 429, probability: 0.1, code: ''}]", r"faults\[0\]: code must be a non-empty"),
    (
        "[{fault: reset, probability: 0.6}, {fault: stall, probability: 0.6, seconds: 1}]",
        r"faults\[1\]: the probabilities of route chat add up to 1.2",
    ),
    (
        "[{fault: status, status: 429, probability: 0.1, route: models}]",
        r"faults\[0\]: route must be one of chat, generation, key",
    ),
    ("[{fault: reset, probability: 0.1, route: key}]", r"faults\[0\]: unknown key 'route' for a reset rule"),
]


@pytest.mark.parametrize(("rules", "message"), BAD_FILES)
def test_a_bad_faults_file_names_the_file_and_the_rule(tmp_path: Path, rules: str, message: str) -> None:
    (tmp_path / "bad.yaml").write_text(rules)
    with pytest.raises(EmulatorError, match=message):
        load_faults(tmp_path / "bad.yaml")


def test_the_server_refuses_a_bad_faults_file_in_one_line(tmp_path: Path) -> None:
    (tmp_path / "bad.yaml").write_text(
        "[{fault: reset, probability: 0.1}, {fault: stall, probability: 0.1}]\n"
    )
    done = subprocess.run(
        [sys.executable, "-m", "support.emulator", "--synthetic", "--faults", str(tmp_path / "bad.yaml")],
        env={**os.environ, **import_path()},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert done.stderr.splitlines() == [
        f"emulator: {tmp_path / 'bad.yaml'}: faults[1]: a stall rule needs 'seconds'"
    ]
