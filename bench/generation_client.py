"""How much CPU the generation client spends per response at 2000 in flight, against a naive baseline.

Each case starts a fresh synthetic emulator (no model) and runs one client in its own process, so the
client's CPU time and peak RSS are its own and the emulator's CPU is measured apart (from /proc). Cases:
eaglepipe's client (`generate_set`: worker pool, journal and ledger fsyncs included) and openai's
AsyncOpenAI with an asyncio.Semaphore, each streamed with 1 and with 8 tokens per SSE event, and not
streamed. The ideal rate is `in_flight x mean tokens / (latency + mean tokens / per-request tok/s)`, what
the emulator's schedule allows if the client never lags;
the rate is measured from the emulator's token counter between the first half-pool of answers and the
last prompt sent (the ramp and the heavy-tailed drain excluded). Client CPU counts from after the client's
imports (start-up is once per job). "of which streaming" is a streamed row's CPU per response less its
client's not-streamed row's, per event: what streaming itself costs, the per-answer work taken out.
"steady client CPU" (not-streamed rows) is the client's CPU per answer (read from /proc as the emulator's
counters are) over the same window as the rate: what a long run pays per answer, without the job's
start-up and end (about 0.1 s of CPU, which the totals spread over the answers: a fifth of a millisecond
each at 450 answers). A streamed row has none from the emulator (`run_case` says why); its
total per event carries the start-up spread over some 270k events, under 0.5 us each. From the replay
server, which counts tokens as it sends them, a streamed row gets "steady client CPU us/event".
The client runs with the real config's budgets (dollars and output tokens), so admissions refit the
budget forecast as in a real run.

    python bench/generation_client.py                      # the full table
    python bench/generation_client.py --in-flight 50 --requests 200 --tokens-per-s 100   # a smoke run
    python bench/generation_client.py --seeds --previous-tree /tmp/ep-prev   # the seeds' shape, old vs new
    python bench/generation_client.py --seeds --tokens-per-s 15 --requests 300 --previous-tree /tmp/ep-prev
        # the same at the seeds' own rate per connection (half the events per read; two waves, ~12 min)

`--seeds` runs the seeds' shape scaled to what two cores can serve (`SEEDS_SHAPE`: long answers at one
token per event, so the per-event cost is what it measures; other options still override it) with only
the rows that compare: this client streamed and not, the same client from `--previous-tree` (another
checkout of the project, e.g. `git worktree add /tmp/ep-prev REV`) and AsyncOpenAI.

`--seeds-full` runs the seeds' own shape (`SEEDS_FULL_SHAPE`: 2000 in flight, ~1,700-token answers at 15
tok/s, one token per event: 30k events/s) from `bench/replay_server.py` (`--replay`), which replays the
emulator's recorded answers for a quarter of a core instead of generating them; this client's rows only
(`--previous-tree` adds others), about seven minutes a row (4000 requests: the steady window, from the
1000th answer to the last prompt sent, needs more than one and a half pools of them):

    python bench/generation_client.py --seeds-full --previous-tree /tmp/ep-prev
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from eaglepipe.emulator.runner import running_server

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))  # the tests' `support` package
from support.emulator import running_emulator  # noqa: E402

MODEL = "moonshotai/kimi-k2.5"
PRICE_PER_TOKEN_USD = 3e-6  # Kimi-K2.5's output price, about $3 per million tokens
CASES = [  # (client, streamed, tokens per SSE event)
    ("eaglepipe", True, 1),
    ("eaglepipe", True, 8),
    ("eaglepipe", False, 8),
    ("eaglepipe, one pool", True, 8),
    ("eaglepipe, one pool", False, 8),
    ("openai+semaphore", True, 1),
    ("openai+semaphore", True, 8),
    ("openai+semaphore", False, 8),
]


def prompts(count: int) -> list[dict[str, Any]]:
    return [
        {"id": f"p{i}", "messages": [{"role": "user", "content": f"Question {i}: explain."}]}
        for i in range(count)
    ]


async def run_eaglepipe(url: str, count: int, in_flight: int, stream: bool, max_tokens: int) -> int:
    import dataclasses

    from eaglepipe.config import validate_config
    from eaglepipe.layout import RunLayout
    from eaglepipe.openrouter.client import generate_set
    from eaglepipe.openrouter.dollars import DollarBudget
    from eaglepipe.openrouter.settings import GenerationSettings

    schema = Path(__file__).resolve().parent.parent / "schemas" / "config.schema.yaml"
    config = validate_config(
        {"datasets": ["bench"], "sources": {"bench": {"type": "jsonl", "path": "-"}},
         "target": {"name": "t", "path": "-"}, "api": {"model": MODEL}},
        schema,
    )
    defaults = GenerationSettings.from_sections(
        config["generation"], model=MODEL, base_url=url, fingerprint="bench", kept=[], provider_obj=None,
        output_token_budget=None, dollar_budget=None, max_failed_fraction=0.0,
    )
    settings = dataclasses.replace(
        defaults,
        base_url=url,
        model=MODEL,
        fingerprint="bench",
        max_tokens=max_tokens,
        concurrency=in_flight,
        stream=stream,
        progress=False,
        recovery_wait_s=0.0,
        # The real config's budgets (config.yaml): admissions then refit the forecast as a real run does.
        output_token_budget=10_000_000,
        dollar_budget=DollarBudget(policy="in_order", run_usd=100.0, set_usd=None),
        expected_request_usd=max_tokens * PRICE_PER_TOKEN_USD,
    )
    with tempfile.TemporaryDirectory() as scratch:
        layout = RunLayout.from_paths(Path(scratch) / "results", Path(scratch) / "prompts")
        summary = await generate_set(
            prompts(count),
            settings=settings,
            api_key=None,
            journal_dir=layout.journal("bench"),
            ledger_dir=layout.ledger,
            dataset="bench",
        )
    return summary.completion_tokens


async def run_openai(url: str, count: int, in_flight: int, stream: bool, max_tokens: int) -> int:
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=url, api_key="bench", max_retries=0, timeout=600)
    semaphore = asyncio.Semaphore(in_flight)
    answers: list[tuple[str, int]] = []

    async def one(prompt: dict[str, Any]) -> None:
        async with semaphore:
            if stream:
                chunks = await client.chat.completions.create(
                    model=MODEL,
                    messages=prompt["messages"],
                    max_tokens=max_tokens,
                    stream=True,
                    stream_options={"include_usage": True},
                )
                text, tokens = [], 0
                async for chunk in chunks:
                    if chunk.choices:
                        text.append(chunk.choices[0].delta.content or "")
                    if chunk.usage:
                        tokens = chunk.usage.completion_tokens
                answers.append(("".join(text), tokens))
            else:
                reply = await client.chat.completions.create(
                    model=MODEL, messages=prompt["messages"], max_tokens=max_tokens
                )
                answers.append((reply.choices[0].message.content or "", reply.usage.completion_tokens))

    await asyncio.gather(*(one(prompt) for prompt in prompts(count)))
    await client.close()
    return sum(tokens for _, tokens in answers)


SEEDS_CASES = [
    ("eaglepipe", True, 1),
    ("eaglepipe", False, 1),
    ("openai+semaphore", True, 1),
    ("openai+semaphore", False, 1),
]
PREVIOUS = "eaglepipe, previous tree"
# The seeds send ~18 answers/s of ~1,700 tokens at one token per event (30k events/s); two cores shared
# with the emulator serve ~4k events/s, so: 150 in flight, 600-token answers at 30 tok/s per request.
SEEDS_SHAPE = {
    "in_flight": 150,
    "requests": 450,
    "mean_tokens": 600,
    "tokens_per_s": 30.0,
    "max_tokens": 2000,
}


# The seeds' own shape, served by bench/replay_server.py (which replays the emulator's answers instead of
# generating them: about a core for 30k events/s): 2000 in flight, ~1,700-token answers at 15 tok/s, one
# token per event. Only this client's rows (`--previous-tree` adds others): the baseline's 0.3-0.4 ms per
# event would take a quarter of an hour to read what is sent in two minutes.
SEEDS_FULL_SHAPE = {
    "in_flight": 2000,
    "requests": 4000,
    "mean_tokens": 1700,
    "tokens_per_s": 15.0,
    "max_tokens": 3000,
    "replay": True,
}
REPLAY_LENGTH_SIGMA = 0.5  # log-normal lengths around the mean, capped at max_tokens


def client_process(args: argparse.Namespace) -> None:
    """One case's client: prints {wall_s, cpu_s, completion_tokens, peak_rss_mb} as JSON."""
    if args.client == "eaglepipe, one pool":  # the design it replaced: one httpx pool for every connection
        from eaglepipe.openrouter import client

        client.POOL_CONNECTIONS = args.in_flight
    run = run_openai if args.client == "openai+semaphore" else run_eaglepipe
    # Imported before the clock starts: start-up is paid once per job, not per answer.
    importlib.import_module("openai" if run is run_openai else "eaglepipe.openrouter.client")
    cpu, wall = time.process_time(), time.monotonic()
    tokens = asyncio.run(run(args.url, args.requests, args.in_flight, args.stream, args.max_tokens))
    print(
        json.dumps(
            {
                "wall_s": time.monotonic() - wall,
                "cpu_s": time.process_time() - cpu,
                "completion_tokens": tokens,
                "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            }
        )
    )


def steady_window(
    samples: list[tuple[float, dict[str, Any]]], in_flight: int, requests: int
) -> list[tuple[float, dict[str, Any]]]:
    """The samples while the client holds `in_flight` requests: from the first half-pool of answers to the
    last prompt sent, so neither the ramp (start-up, connections) nor the heavy-tailed drain counts."""
    return [
        (at, stats)
        for at, stats in samples
        if stats["responses_completed"] >= in_flight // 2 and stats["requests_received"] < requests
    ]


def steady_rate(window: list[tuple[float, dict[str, Any]]]) -> float:
    """Output tok/s over the steady window."""
    if len(window) < 2:
        return float("nan")
    (start, first), (end, last) = window[0], window[-1]
    return (last["completion_tokens"] - first["completion_tokens"]) / (end - start)


def steady_cpu(window: list[tuple[float, dict[str, Any]]], counted: str) -> float | None:
    """The client's CPU seconds per unit of the server's counter `counted` (`responses_completed`,
    `completion_tokens`) over the steady window: what a long run pays, without the once-per-job start-up
    and end that the totals spread over the answers."""
    if len(window) < 2:
        return None
    first, last = window[0][1], window[-1][1]
    units = last[counted] - first[counted]
    return (last["client_cpu_s"] - first["client_cpu_s"]) / units if units else None


def process_cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run_case(
    args: argparse.Namespace, client: str, stream: bool, per_event: int, tree: Path | None = None
) -> dict[str, Any]:
    """One row. A previous tree's client runs with that checkout first on PYTHONPATH (the client process
    starts from bench/, so the working copy's package is not on its path)."""
    pacing = ["--tokens-per-s", str(args.tokens_per_s), "--latency-s", str(args.latency_s)]
    pacing += ["--mean-tokens", str(args.mean_tokens)]
    emulator = ["--model-id", MODEL, "--seed", "1", *pacing, "--tokens-per-event", str(per_event)]
    replay = [*pacing, "--length-sigma", str(REPLAY_LENGTH_SIGMA), "--record-tokens", str(args.max_tokens)]
    replay_server = [sys.executable, str(Path(__file__).with_name("replay_server.py")), *replay]
    server = (
        running_server(replay_server, "replay server")
        if args.replay
        else running_emulator(None, extra_args=emulator)
    )
    with server as url:
        pid = httpx.get(f"{url}/emulator/stats").json()["pid"]
        server_cpu = process_cpu_s(pid)
        env = dict(os.environ)
        if tree is not None:
            env["PYTHONPATH"] = str(tree)
        command = [
            sys.executable,
            __file__,
            "--client",
            "eaglepipe" if client == PREVIOUS else client,
            "--url",
            url,
            "--requests",
            str(args.requests),
            "--in-flight",
            str(args.in_flight),
            "--max-tokens",
            str(args.max_tokens),
        ]
        if stream:
            command.append("--stream")
        samples: list[tuple[float, dict[str, Any]]] = []
        process = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
        )
        while process.poll() is None:
            stats = httpx.get(f"{url}/emulator/stats").json()
            try:
                stats["client_cpu_s"] = process_cpu_s(process.pid)
            except (OSError, IndexError):  # the client just exited
                break
            samples.append((time.monotonic(), stats))
            time.sleep(0.5)
        out, err = process.communicate()
        done = subprocess.CompletedProcess(command, process.returncode, out, err)
        if done.returncode != 0:
            raise SystemExit(f"{client} failed: {done.stderr.strip().splitlines()[-1:]}")
        measured = json.loads(done.stdout.strip().splitlines()[-1])
        stats = httpx.get(f"{url}/emulator/stats").json()
        measured["server_cpu_s"] = process_cpu_s(pid) - server_cpu
    responses = stats["responses_completed"]
    mean_tokens = stats["completion_tokens"] / max(1, stats["requests_billed"])
    ideal = args.in_flight * mean_tokens / (args.latency_s + mean_tokens / args.tokens_per_s)
    window = steady_window(samples, args.in_flight, args.requests)
    rate = steady_rate(window)
    events = stats["completion_tokens"] / per_event if stream else None
    steady = None if stream else steady_cpu(window, "responses_completed")
    # Per event only where the server counts tokens as it sends them (the replay server): the emulator
    # counts an answer's tokens when it ends, so a window cannot tell which of a stream's events (and their
    # CPU) fell inside it. Events sent but not yet read are few: each connection is read every half second.
    as_sent = bool(window) and window[0][1].get("counts_tokens_as_sent")
    steady_event = steady_cpu(window, "completion_tokens") if stream and as_sent else None
    return {
        "client": f"{client} ({tree.name})" if tree is not None else client,
        "mode": f"stream, {per_event}/event" if stream else "not streamed",
        "responses": responses,
        "tok_s": rate,
        "ideal_tok_s": ideal,
        "of_ideal": rate / ideal,
        "client_cpu_ms_per_response": measured["cpu_s"] / responses * 1000,
        # Everything the client spent, per SSE event (its per-response work included): an upper bound.
        "client_cpu_us_per_event": measured["cpu_s"] / events * 1e6 if events else None,
        "events_per_response": events / responses if events else None,
        # Not streamed: the same over the steady window only (no start-up, no drain).
        "steady_client_cpu_ms_per_response": steady * 1e3 if steady is not None else None,
        # Streamed, where the server counts tokens as sent: the client's CPU per event over that window.
        "steady_client_cpu_us_per_event": steady_event * 1e6 if steady_event is not None else None,
        "client_cores": measured["cpu_s"] / measured["wall_s"],
        "peak_rss_mb": measured["peak_rss_mb"],
        "server_cpu_ms_per_response": measured["server_cpu_s"] / responses * 1000,
    }


def add_streaming_cost(rows: list[dict[str, Any]]) -> None:
    """What streaming adds per event: a streamed row's CPU per response less its client's not-streamed
    row's, over the events of a response (the per-answer work both pay cancels out)."""
    plain = {r["client"]: r for r in rows if r["events_per_response"] is None}
    for r in rows:
        base = plain.get(r["client"])
        r["streaming_cpu_us_per_event"] = (
            (r["client_cpu_ms_per_response"] - base["client_cpu_ms_per_response"])
            * 1000
            / r["events_per_response"]
            if base and r["events_per_response"]
            else None
        )


def table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| client | mode | responses | tok/s | of ideal | client CPU ms/resp | client CPU us/event | "
        "of which streaming us/event | steady client CPU ms/resp | steady client CPU us/event | "
        "client cores | peak RSS MB | server CPU ms/resp |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        per_event = f"{r['client_cpu_us_per_event']:.0f}" if r["client_cpu_us_per_event"] else "-"
        streaming = r.get("streaming_cpu_us_per_event")
        steady = r["steady_client_cpu_ms_per_response"]
        steady_text = "-" if steady is None else f"{steady:.2f}"
        steady_event = r.get("steady_client_cpu_us_per_event")
        steady_event_text = "-" if steady_event is None else f"{steady_event:.1f}"
        lines.append(
            f"| {r['client']} | {r['mode']} | {r['responses']} | {r['tok_s']:,.0f} | {r['of_ideal']:.0%} | "
            f"{r['client_cpu_ms_per_response']:.2f} | {per_event} | "
            f"{'-' if streaming is None else f'{streaming:.0f}'} | {steady_text} | {steady_event_text} | "
            f"{r['client_cores']:.2f} | "
            f"{r['peak_rss_mb']:.0f} | {r['server_cpu_ms_per_response']:.2f} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--in-flight", type=int, default=2000)
    parser.add_argument("--requests", type=int, default=4000)
    parser.add_argument("--tokens-per-s", type=float, default=15.0, help="per request, as a provider streams")
    parser.add_argument("--mean-tokens", type=int, default=150)
    parser.add_argument("--latency-s", type=float, default=0.5)
    parser.add_argument("--max-tokens", type=int, default=600)
    parser.add_argument("--json", type=Path, help="also write the rows here")
    parser.add_argument("--seeds", action="store_true", help="the seeds' shape, comparison rows only")
    parser.add_argument(
        "--seeds-full", action="store_true", help="the seeds' own shape from the replay server, this client"
    )
    parser.add_argument("--replay", action="store_true", help="bench/replay_server.py, not the emulator")
    parser.add_argument(
        "--previous-tree",
        type=Path,
        action="append",
        default=[],
        help="another checkout whose client gets rows too (repeatable)",
    )
    parser.add_argument("--client", choices=sorted({case[0] for case in CASES}), help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    parser.add_argument("--stream", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.seeds:  # the seeds' long answers at one token per event, scaled to what two cores serve
        parser.set_defaults(**SEEDS_SHAPE)
        args = parser.parse_args()
    if args.seeds_full:
        parser.set_defaults(**SEEDS_FULL_SHAPE)
        args = parser.parse_args()
    if args.client:
        client_process(args)
        return
    cases = SEEDS_CASES[:2] if args.seeds_full else SEEDS_CASES if args.seeds else CASES
    previous = [(tree, PREVIOUS, stream, 1) for tree in args.previous_tree for stream in (True, False)]
    cases = [*[(None, *case) for case in cases[:2]], *previous, *[(None, *case) for case in cases[2:]]]
    if args.replay:  # the replay server sends one token per event
        cases = [case for case in cases if case[3] == 1]
    rows = []
    for tree, client, stream, per_event in cases:
        rows.append(run_case(args, client, stream, per_event, tree))
        print(f"done: {client}, {rows[-1]['mode']}", file=sys.stderr, flush=True)
    print(
        f"{args.in_flight} in flight, {args.requests} requests, {args.tokens_per_s:g} tok/s per request, "
        f"mean {args.mean_tokens} tokens, first token after {args.latency_s:g} s"
    )
    add_streaming_cost(rows)
    print(table(rows))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
