"""Failure handling against a scripted OpenRouter-shaped server on loopback: each prompt's text names a
script, and its n-th attempt gets the script's n-th answer (the emulator serves only healthy answers)."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
import uvicorn
from stage_settings import generation_settings
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from eaglepipe.openrouter.client import GenerationSummary, generate_set
from eaglepipe.openrouter.journal import load_done
from eaglepipe.openrouter.ledger import read_ledger
from eaglepipe.tokens.probe import usability_probe

USAGE = {"prompt_tokens": 5, "completion_tokens": 2, "cost": 0.001, "completion_tokens_details": {}}


def ok(content: str = "fine", provider: str = "Fake", **choice_fields: Any) -> Response:
    message = {"role": "assistant", "content": content}
    choice = {"index": 0, "message": message, "finish_reason": "stop", **choice_fields}
    return JSONResponse({"id": "gen-ok", "provider": provider, "choices": [choice], "usage": USAGE})


def error(status: int, headers: dict[str, str] | None = None) -> Response:
    return JSONResponse({"error": {"code": status, "message": f"scripted {status}"}}, status, headers)


def sse(*events: dict[str, Any] | str) -> Response:
    lines = [event if isinstance(event, str) else f"data: {json.dumps(event)}\n\n" for event in events]
    return Response("".join(lines) + "data: [DONE]\n\n", media_type="text/event-stream")


def chunk(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> dict[str, Any]:
    return {
        "id": "gen-s",
        "provider": "Fake",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        **extra,
    }


def openrouter_error(
    status: int, message: str, headers: dict[str, str] | None = None, **metadata: Any
) -> Response:
    """An error body as OpenRouter documents it: code, message, metadata (limit_source, provider_name...)."""
    body = {"error": {"code": status, "message": message, "metadata": metadata}}
    return JSONResponse(body, status, headers)


KEY_LIMIT = {
    "limit_source": "openrouter_key_limit", "limit_usd": 5, "spend_usd": 5.01, "resets_at": "2026-12-02"
}
PROVIDER_400 = {"provider_name": "Chutes", "raw": "upstream worker restarted"}

SCRIPTS: dict[str, list[Response]] = {
    "key-limit": [openrouter_error(403, "Key limit exceeded", **KEY_LIMIT)],
    "workspace-budget": [
        openrouter_error(
            403, "Workspace budget exceeded", limit_source="openrouter_workspace_budget", limit_usd=50
        )
    ],
    "in-flight-budget": [
        openrouter_error(402, "In-flight budget reached", {"Retry-After": "0.3"},
                         limit_source="openrouter_in_flight_budget"),
        ok(),
    ],
    "too-dear": [
        openrouter_error(402, "This request requires more credits, or fewer max_tokens. You requested up to "
                         "16384 tokens, but can only afford 9000.", limit_source="openrouter_credits")
    ],
    "provider-400-passes": [openrouter_error(400, "Provider returned error", **PROVIDER_400), ok()],
    "provider-400-stays": [openrouter_error(400, "Provider returned error", **PROVIDER_400)] * 3,
    "string-code-in-200": [JSONResponse({"error": {"code": "502", "message": "upstream"}}), ok()],
    # The circuit breaker and the usability probe.
    "chutes-400": [openrouter_error(400, "Provider returned error", **PROVIDER_400)] * 3,
    "after-the-drop": [ok()],
    "foreign": [ok(provider="Elsewhere")] * 3,
    "leaks-a-marker": [ok("fine<|im_end|>more", provider="Leaky")],
    "leaks-again": [ok("<|im_start|>user", provider="Leaky")],
    "clean": [ok("A clean answer.")],
    "with-logprobs": [
        ok("Hi", logprobs={"content": [
            {"token": "H", "bytes": [72], "logprob": -0.1, "top_logprobs": [{"token": "H", "logprob": -0.1}]},
            {"token": "i", "bytes": [105], "logprob": -0.2, "top_logprobs": []},
        ]})
    ],
    "streamed-logprobs": [
        sse(
            {"id": "gen-s", "provider": "Fake", "choices": [{
                "index": 0, "delta": {"content": "H"}, "finish_reason": None,
                "logprobs": {"content": [{"token": "H", "bytes": [72], "logprob": -0.1}]},
            }]},
            {"id": "gen-s", "provider": "Fake", "choices": [{
                "index": 0, "delta": {"content": "i"}, "finish_reason": "stop",
                "logprobs": {"content": [{"token": "i", "bytes": [105], "logprob": -0.2}]},
            }]},
            {"id": "gen-s", "choices": [], "usage": USAGE},
        )
    ],
    "parallel-calls-at-index-0": [
        sse(
            chunk({"tool_calls": [{"index": 0, "id": "call_a", "type": "function",
                                   "function": {"name": "f", "arguments": '{"x": '}}]}),
            chunk({"tool_calls": [{"index": 0, "function": {"arguments": "1}"}}]}),
            chunk(
                {"tool_calls": [{"index": 0, "id": "call_b", "type": "function",
                                 "function": {"name": "g", "arguments": '{"y": 2}'}}]},
                finish="tool_calls",
            ),
            {"id": "gen-s", "choices": [], "usage": USAGE},
        )
    ],
    "streamed-reasoning-details": [
        sse(
            chunk({"reasoning_details": [{"type": "reasoning.text", "text": "Let ", "index": 0}]}),
            chunk({"reasoning_details": [{"type": "reasoning.text", "text": "me think.", "index": 0}]}),
            chunk({"content": "Done."}, finish="stop"),
            {"id": "gen-s", "choices": [], "usage": USAGE},
        )
    ],
    "reasoning-details-only": [
        JSONResponse({"id": "gen-r", "provider": "Fake", "usage": USAGE, "choices": [{
            "index": 0, "finish_reason": "stop",
            "message": {"role": "assistant", "content": "42", "reasoning_details": [
                {"type": "reasoning.summary", "summary": "Added the numbers."},
                {"type": "reasoning.encrypted", "data": "b64=="},
            ]},
        }]})
    ],
    "no-usage-chunk": [sse(chunk({"content": "answer without a bill"}, finish="stop"))],
    "cost-null": [
        sse(
            chunk({"content": "ok"}, finish="stop", id="gen-null"),
            {"id": "gen-null", "choices": [], "usage": {**USAGE, "cost": None}},
        )
    ],
    "reasoning-content": [
        JSONResponse({"id": "gen-r", "provider": "Fake", "usage": USAGE, "choices": [{
            "index": 0, "finish_reason": "stop",
            "message": {"role": "assistant", "content": "42", "reasoning_content": "Six times seven."},
        }]})
    ],
    "rate-limited": [error(429, {"Retry-After": "0.3"}), ok()],
    "errors-inside-200": [
        JSONResponse(
            {
                "id": "x",
                "choices": [
                    {
                        "index": 0,
                        "message": {"content": "partial"},
                        "finish_reason": "error",
                        "error": {"code": 502, "message": "provider died"},
                    }
                ],
            }
        ),
        JSONResponse({"error": {"code": 503, "message": "overloaded"}}),
        JSONResponse({"id": "x", "choices": [], "usage": USAGE}),
        ok("kept"),
    ],
    "moderated": [error(403)],
    "overloaded": [error(502), error(524), error(500)],
    "no-endpoint": [error(404)],
    "stream-tools": [
        sse(
            ": OPENROUTER PROCESSING\n\n",
            chunk({"role": "assistant", "content": "Let me "}),
            chunk(
                {
                    "tool_calls": [
                        {
                            "index": 0,
                            "id": "functions.f:0",
                            "type": "function",
                            "function": {"name": "f", "arguments": '{"a": '},
                        }
                    ]
                }
            ),
            ": OPENROUTER PROCESSING\n\n",
            chunk({"tool_calls": [{"index": 0, "function": {"arguments": "1}"}}]}, finish="tool_calls"),
            {"id": "gen-s", "choices": [], "usage": USAGE},
        )
    ],
    "stream-error": [
        sse(
            chunk({"content": "half"}),
            {
                "id": "gen-s",
                "error": {"code": 502, "message": "cut"},
                "choices": [{"index": 0, "delta": {}, "finish_reason": "error"}],
            },
        ),
        sse(chunk({"content": "whole"}, finish="stop"), {"id": "gen-s", "choices": [], "usage": USAGE}),
    ],
}


class ScriptedServer:
    def __init__(self) -> None:
        self.attempt_times: dict[str, list[float]] = defaultdict(list)
        self.bodies: dict[str, list[dict[str, Any]]] = defaultdict(list)
        # What `/generation` knows: id -> cost (unknown ids answer 404, as OpenRouter does for a while).
        self.generations: dict[str, float] = {}
        app = Starlette(routes=[
            Route("/api/v1/chat/completions", self.complete, methods=["POST"]),
            Route("/api/v1/generation", self.generation, methods=["GET"]),
        ])
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)

    async def complete(self, request: Request) -> Response:
        body = await request.json()
        script = body["messages"][0]["content"]
        self.attempt_times[script].append(time.monotonic())
        self.bodies[script].append(body)
        return SCRIPTS[script][len(self.attempt_times[script]) - 1]

    async def generation(self, request: Request) -> Response:
        generation_id = request.query_params.get("id", "")
        if generation_id not in self.generations:
            return JSONResponse({"error": {"code": 404, "message": "not found"}}, 404)
        cost = self.generations[generation_id]
        return JSONResponse({"data": {"id": generation_id, "total_cost": cost, "tokens_completion": 2,
                                      "provider_name": "Fake"}})

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.sock.getsockname()[1]}/api/v1"


@pytest.fixture
def scripted() -> Iterator[ScriptedServer]:
    server = ScriptedServer()
    server.thread.start()
    while not server.server.started:
        time.sleep(0.01)
    yield server
    server.server.should_exit = True
    server.thread.join()


def run(
    server: ScriptedServer, scripts: list[str], journal: Path, probe: Any = None, **changes: Any
) -> GenerationSummary:
    prompts = [{"id": name, "messages": [{"role": "user", "content": name}]} for name in scripts]
    settings = generation_settings(
        **{
            "base_url": server.base_url,
            "model": "m",
            "fingerprint": "f",
            "max_tokens": 4,
            "concurrency": 1,
            "max_attempts": 4,
            "backoff_base_s": 0.01,
            "stream": False,
            "recovery_wait_s": 0.0,
            "progress": False,
            **changes,
        }
    )

    async def generate() -> GenerationSummary:
        return await generate_set(
            prompts, settings=settings, api_key=None, journal_dir=journal, ledger_dir=journal, dataset="s",
            probe=probe,
        )

    return anyio.run(generate)


def test_transient_failures_retried_honouring_retry_after(scripted: ScriptedServer, tmp_path: Path) -> None:
    summary = run(scripted, ["rate-limited", "errors-inside-200"], tmp_path)
    assert summary.ended_because == "all_done" and summary.retries == 1 + 3
    first, second = scripted.attempt_times["rate-limited"]
    assert second - first >= 0.3
    done = load_done(tmp_path, "f")
    assert done["errors-inside-200"]["response"]["content"] == "kept"
    assert [done[name]["attempts"] for name in ("rate-limited", "errors-inside-200")] == [2, 4]


def test_permanent_and_exhausted_failures_are_recorded_not_kept(
    scripted: ScriptedServer, tmp_path: Path
) -> None:
    summary = run(scripted, ["moderated", "overloaded"], tmp_path, max_attempts=3)
    assert (summary.failed_permanent, summary.failed_transient, summary.done) == (1, 1, 0)
    assert summary.ended_because == "failures" and summary.message.startswith(
        "1 prompt(s) failed transiently, first overloaded"
    )
    assert [(f["prompt_id"], f["status"], f["attempts"]) for f in summary.failures] == [
        ("moderated", 403, 1),
        ("overloaded", 500, 3),
    ]
    assert load_done(tmp_path, "f") == {}


def test_no_endpoint_stops_new_requests(scripted: ScriptedServer, tmp_path: Path) -> None:
    summary = run(scripted, ["no-endpoint", "rate-limited"], tmp_path)
    assert summary.ended_because == "no_endpoint" and "relax `routing`" in summary.message
    assert "rate-limited" not in scripted.attempt_times


def test_stream_skips_comments_merges_tool_calls_and_rejects_error_chunks(
    scripted: ScriptedServer, tmp_path: Path
) -> None:
    summary = run(scripted, ["stream-tools", "stream-error"], tmp_path, stream=True)
    assert summary.ended_because == "all_done"
    done = load_done(tmp_path, "f")
    tools = done["stream-tools"]
    assert tools["response"] == {
        "content": "Let me ",
        "reasoning": None,
        "tool_calls": [
            {"id": "functions.f:0", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}
        ],
        "finish_reason": "tool_calls",
    }
    assert tools["usage"] == {
        "prompt_tokens": 5,
        "completion_tokens": 2,
        "reasoning_tokens": 0,
        "cost": 0.001,
    }
    assert done["stream-error"]["response"]["content"] == "whole" and done["stream-error"]["attempts"] == 2


def test_budget_403s_stop_the_run_resumable_never_fail_the_prompt(
    scripted: ScriptedServer, tmp_path: Path
) -> None:
    summary = run(scripted, ["key-limit", "rate-limited"], tmp_path)
    assert summary.ended_because == "key_limit" and summary.failed_permanent == 0 and summary.failures == []
    assert "openrouter_key_limit: limit_usd 5, spend_usd 5.01, resets_at 2026-12-02" in summary.message
    assert "raise the key's limit" in summary.message and "rate-limited" not in scripted.attempt_times

    summary = run(scripted, ["workspace-budget"], tmp_path / "w")
    assert summary.ended_because == "budget_limit" and "workspace budget" in summary.message


def test_in_flight_budget_402_is_waited_out_and_retried(scripted: ScriptedServer, tmp_path: Path) -> None:
    summary = run(scripted, ["in-flight-budget"], tmp_path)
    assert summary.ended_because == "all_done" and summary.done == 1
    assert summary.errors_by_class == {"in_flight_budget": 1}
    first, second = scripted.attempt_times["in-flight-budget"]
    assert second - first >= 0.3


def test_a_request_dearer_than_the_whole_budget_stops_with_the_setting_to_lower(
    scripted: ScriptedServer, tmp_path: Path
) -> None:
    summary = run(scripted, ["too-dear", "rate-limited"], tmp_path)
    assert summary.ended_because == "request_too_dear" and "lower generation.max_tokens" in summary.message
    assert len(scripted.attempt_times["too-dear"]) == 1 and "rate-limited" not in scripted.attempt_times


def test_provider_400s_get_a_few_tries_then_fail_with_the_providers_message(
    scripted: ScriptedServer, tmp_path: Path
) -> None:
    summary = run(scripted, ["provider-400-passes", "provider-400-stays", "string-code-in-200"], tmp_path)
    assert summary.done == 2 and summary.failed_permanent == 1 and summary.failed_transient == 0
    (failure,) = summary.failures
    assert (failure["prompt_id"], failure["status"], failure["attempts"]) == ("provider-400-stays", 400, 3)
    assert "[Chutes: upstream worker restarted]" in failure["error"]
    assert summary.errors_by_class["provider_refused"] == 4
    assert len(scripted.attempt_times["string-code-in-200"]) == 2  # "502" as a string is still a 502


def test_parallel_tool_calls_sent_at_one_index_stay_apart_by_id(
    scripted: ScriptedServer, tmp_path: Path
) -> None:
    run(scripted, ["parallel-calls-at-index-0"], tmp_path, stream=True)
    calls = load_done(tmp_path, "f")["parallel-calls-at-index-0"]["response"]["tool_calls"]
    assert [(c["id"], c["function"]["name"], c["function"]["arguments"]) for c in calls] == [
        ("call_a", "f", '{"x": 1}'),
        ("call_b", "g", '{"y": 2}'),
    ]


def test_reasoning_is_read_from_every_field_providers_use(scripted: ScriptedServer, tmp_path: Path) -> None:
    run(scripted, ["streamed-reasoning-details"], tmp_path / "s", stream=True)
    run(scripted, ["reasoning-details-only", "reasoning-content"], tmp_path / "p")
    streamed = load_done(tmp_path / "s", "f")["streamed-reasoning-details"]["response"]
    assert streamed["reasoning"] == "Let me think." and streamed["content"] == "Done."
    assert streamed["reasoning_details"] == [{"type": "reasoning.text", "text": "Let me think.", "index": 0}]
    plain = load_done(tmp_path / "p", "f")
    summary_only = plain["reasoning-details-only"]["response"]
    assert summary_only["reasoning"] == "Added the numbers." and summary_only["reasoning_encrypted"] is True
    assert summary_only["reasoning_details"][1] == {"type": "reasoning.encrypted", "data": "b64=="}
    assert plain["reasoning-content"]["response"]["reasoning"] == "Six times seven."


def test_an_answer_without_a_cost_is_held_unpriced_until_generation_prices_it(
    scripted: ScriptedServer, tmp_path: Path
) -> None:
    """Never booked at $0 without proof: kept in the journal, left unresolved in the ledger (so the budget
    holds it at its worst case), and priced from `/generation` once it knows it, here at the next start."""
    summary = run(scripted, ["no-usage-chunk", "cost-null"], tmp_path, stream=True)
    assert summary.done == 2 and summary.unresolved == 2
    view = read_ledger(tmp_path)
    assert view.usd == 0 and view.billed == 0 and sorted(view.unresolved) == ["gen-null", "gen-s"]

    scripted.generations.update({"gen-s": 0.004, "gen-null": 0.002})
    again = run(scripted, ["no-usage-chunk", "cost-null"], tmp_path, stream=True)
    assert again.resumed == 2 and again.unresolved == 0 and again.recovered == 2
    view = read_ledger(tmp_path)
    assert view.usd == pytest.approx(0.006) and view.by_outcome == {"recovered": 2} and not view.unresolved


ROUTED = {  # two kept endpoints, as stage.py passes them from providers.json
    "allowed_providers": ("Chutes", "Fake"),
    "endpoint_tags": (("Chutes", "chutes/fp8"), ("Fake", "fake")),
    "provider_obj": {"only": ["chutes/fp8", "fake"], "allow_fallbacks": False},
}


def test_a_provider_past_its_strikes_is_dropped_from_routing(
    scripted: ScriptedServer, tmp_path: Path
) -> None:
    summary = run(scripted, ["chutes-400", "after-the-drop"], tmp_path, breaker_strikes=3, **ROUTED)
    assert summary.ended_because == "all_done" and summary.done == 1 and summary.failed_permanent == 1
    assert summary.breaker["dropped"] == {
        "Chutes": "3 unusable of 3 returned, 3 of its last 3 (provider_refused x3)"
    }
    assert [b["provider"]["only"] for b in scripted.bodies["chutes-400"]] == [["chutes/fp8", "fake"]] * 3
    (after,) = scripted.bodies["after-the-drop"]
    assert after["provider"] == {"only": ["fake"], "allow_fallbacks": False}
    assert load_done(tmp_path, "f")["after-the-drop"]["request"]["provider"]["only"] == ["fake"]


def test_dropping_the_last_provider_stops_the_run_resumable(
    scripted: ScriptedServer, tmp_path: Path
) -> None:
    only_chutes = {**ROUTED, "allowed_providers": ("Chutes",), "endpoint_tags": (("Chutes", "chutes/fp8"),)}
    summary = run(scripted, ["chutes-400", "after-the-drop"], tmp_path, breaker_strikes=3, **only_chutes)
    assert summary.ended_because == "no_usable_provider" and "Chutes: 3 unusable of 3" in summary.message
    assert "after-the-drop" not in scripted.attempt_times and summary.failures[0]["prompt_id"] == "chutes-400"


def test_answers_from_a_provider_routing_did_not_keep_stop_the_run_after_a_few(
    scripted: ScriptedServer, tmp_path: Path
) -> None:
    """Each is paid and discarded; retrying would only buy more, so past the threshold the run stops."""
    summary = run(scripted, ["foreign", "clean"], tmp_path, breaker_strikes=2, allowed_providers=("Fake",))
    assert summary.ended_because == "foreign_provider" and "'Elsewhere' x2" in summary.message
    assert len(scripted.attempt_times["foreign"]) == 2 and "clean" not in scripted.attempt_times
    assert summary.breaker["discarded_from"] == {"Elsewhere": 2}
    assert read_ledger(tmp_path).by_outcome == {"discarded": 2}


def test_the_usability_probe_drops_a_provider_whose_answers_the_token_stage_refuses(
    scripted: ScriptedServer, tmp_path: Path, model_dir: Path
) -> None:
    """The token stage's own structural check (the embedded model's tokenizer) on each provider's first
    answers: markers inside text make Leaky's answers unusable; Fake's clean answer passes."""
    probe = usability_probe(model_dir)
    routed = {
        "allowed_providers": ("Fake", "Leaky"),
        "endpoint_tags": (("Fake", "fake"), ("Leaky", "leaky")),
        "provider_obj": {"only": ["fake", "leaky"]},
    }
    scripts = ["clean", "leaks-a-marker", "leaks-again", "after-the-drop"]
    summary = run(scripted, scripts, tmp_path, probe=probe, breaker_strikes=2, **routed)
    assert summary.ended_because == "all_done" and summary.done == 4  # paid answers are kept all the same
    assert summary.probed == {"Fake": 2, "Leaky": 2}
    assert set(summary.breaker["dropped"]) == {"Leaky"}
    assert all(reason.startswith("unusable answer: ") for reason in summary.breaker["strikes"]["Leaky"])
    assert scripted.bodies["after-the-drop"][0]["provider"]["only"] == ["fake"]
    assert probe({"id": "p", "messages": [{"role": "user", "content": "clean"}]},
                 load_done(tmp_path, "f")["clean"]) is None


def test_logprobs_are_asked_for_and_kept_without_the_alternatives(
    scripted: ScriptedServer, tmp_path: Path
) -> None:
    run(scripted, ["with-logprobs"], tmp_path / "p", logprobs=True)
    run(scripted, ["streamed-logprobs"], tmp_path / "s", logprobs=True, stream=True)
    (body,) = scripted.bodies["with-logprobs"]
    assert (body["logprobs"], body["top_logprobs"]) == (True, 0)
    want = {"content": [
        {"token": "H", "bytes": [72], "logprob": -0.1}, {"token": "i", "bytes": [105], "logprob": -0.2}
    ]}
    assert load_done(tmp_path / "p", "f")["with-logprobs"]["response"]["logprobs"] == want
    assert load_done(tmp_path / "s", "f")["streamed-logprobs"]["response"]["logprobs"] == want
