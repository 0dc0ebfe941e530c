"""The end-of-run table on the terminal (Snakemake `onsuccess`), and one line per failed job (`onerror`).

The table answers the three questions a run is for: what was bought, can its token ids be trusted, and is
the drafter any good. A dash marks what this run has not (yet) produced.
"""

from __future__ import annotations

import html
import re
from datetime import datetime
from pathlib import Path
from typing import Any, Literal

from eaglepipe.figures.data import RunOutputs
from eaglepipe.tokens.token_file import RoundTripReport

DASH = "-"
METHOD_LABELS = {"eagle3": "trained drafter", "eagle3_untrained": "untrained drafter",
                 "prompt_lookup": "prompt lookup"}
ROUND_TRIP_MISSES: dict[Literal["count_matched", "off"], str] = {"count_matched": "same length", "off": "off"}


def _share(value: float | None) -> str:
    return DASH if value is None else f"{100 * value:.1f}%"


def _set_row(item: Any) -> list[str]:
    summary, tokens, hidden = item.summary or {}, item.token_stats, item.hidden or {}
    shares = tokens.get("shares", {})
    return [
        item.name,
        str(summary["done"]) if "done" in summary else DASH,
        _output_tokens(summary),
        f"${summary['dollars']:.4f}" if "dollars" in summary else DASH,
        _share(shares.get("exact")) if tokens else DASH,
        _share(shares.get("billed_count_matched")) if tokens else DASH,
        _share((tokens.get("yield") or {}).get("trained_share")) if tokens else DASH,
        f"{hidden['num_tokens']:,}" if "num_tokens" in hidden else DASH,
        _round_trip(tokens.get("round_trip")),
    ]


def _output_tokens(summary: dict[str, Any]) -> str:
    """The set's billed output tokens; a dash where no answer had a count (imported answers without usage),
    and the uncounted ones named where only some had."""
    if "completion_tokens" not in summary:
        return DASH
    uncounted = summary.get("uncounted") or 0
    if uncounted and uncounted >= summary.get("done", 0):
        return DASH
    return f"{summary['completion_tokens']:,}" + (f" (+{uncounted} uncounted)" if uncounted else "")


def _total_row(sets: list[Any]) -> list[str]:
    """The run's totals: answers, output tokens and dollars summed, the share trained on over all sets."""
    summaries = [item.summary for item in sets if item.summary]
    yields = [item.token_stats.get("yield") or {} for item in sets]
    bought = sum(y.get("bought_tokens") or 0 for y in yields)
    trained = sum(y.get("trained_tokens") or 0 for y in yields)
    hidden = [item for item in sets if (item.hidden or {}).get("num_tokens") is not None]
    return [
        "total",
        str(sum(s.get("done", 0) for s in summaries)) if summaries else DASH,
        f"{sum(s.get('completion_tokens', 0) for s in summaries):,}" if summaries else DASH,
        f"${sum(s.get('dollars', 0.0) for s in summaries):.4f}" if summaries else DASH,
        DASH,
        DASH,
        _share(trained / bought) if bought else DASH,
        f"{sum(item.hidden['num_tokens'] for item in hidden):,}" if hidden else DASH,
        DASH,
    ]


def _dropped_line(sets: list[Any]) -> str | None:
    """Where the bought output tokens that were not trained on went, by cause, with their dollars."""
    causes: dict[str, list[float]] = {}
    for item in sets:
        for cause, figures in ((item.token_stats.get("yield") or {}).get("dropped") or {}).items():
            total = causes.setdefault(cause, [0, 0.0])
            total[0] += figures["tokens"]
            total[1] += figures["usd"]
    if not causes:
        return None
    parts = [f"{cause} {tokens:,.0f} tokens (${usd:.4f})" for cause, (tokens, usd) in sorted(causes.items())]
    return "not trained on: " + ", ".join(parts)


def _round_trip(gate: RoundTripReport | None) -> str:
    """`23/24 exact, 1 off`: the text-only rebuild against the server's ids, where the set has any."""
    if not gate or not gate.get("samples"):
        return DASH
    misses = [f"{gate[kind]} {label}" for kind, label in ROUND_TRIP_MISSES.items() if gate.get(kind)]
    return ", ".join([f"{gate['exact']}/{gate['samples']} exact", *misses])


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    lines = []
    for row in [header, *rows]:
        cells = [row[0].ljust(widths[0])]
        cells += [cell.rjust(width) for cell, width in zip(row[1:], widths[1:], strict=True)]
        lines.append("  ".join(cells))
    return lines


def run_table(run: RunOutputs, *, emulated: bool = False) -> str:
    """Per set and in total: answers, output tokens, dollars, exact / count-matched share, the share of
    bought output tokens trained on, hidden-state tokens, the round-trip gate (where the server returned
    ids); what was not trained on, by cause; then the drafter's acceptance length next to prompt lookup and
    the untrained drafter."""
    header = ["set", "answers", "output tokens", "dollars", "exact ids", "count-matched", "to training",
              "hidden tokens", "round trip"]
    lines = ["eaglepipe: end of run" + (" (emulated: no real request, no real dollar)" if emulated else "")]
    rows = [_set_row(item) for item in run.sets]
    lines += _table(header, [*rows, _total_row(run.sets)] if len(rows) > 1 else rows)
    lines.append(
        "exact ids: token ids the server returned; count-matched: ids whose count equals the billed "
        "completion tokens; to training: the share of bought output tokens the token stage kept"
    )
    dropped = _dropped_line(run.sets)
    if dropped:
        lines.append(dropped)
    lines.append("round trip: the server's ids rebuilt from the text alone (exact, same length, off)")
    evaluation = run.eval
    methods = evaluation.get("methods", {}) if evaluation else {}
    if methods:
        cells = [
            f"{label} {methods[name]['acceptance_length']}"
            for name, label in METHOD_LABELS.items()
            if name in methods
        ]
        held_out = evaluation.get("held_out_prompts", DASH) if evaluation else DASH
        lines.append(f"acceptance length on {held_out} held-out prompts: " + ", ".join(cells))
    else:
        lines.append("acceptance length: - (no drafter/eval.json yet)")
    return "\n".join(lines)


def run_table_page(table: str) -> str:
    """The end-of-run table as a self-contained web page: the Snakemake report shows an HTML result in
    its page (a text file only as a download), so its run section opens on the table itself."""
    title = html.escape(table.splitlines()[0])
    return (
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
        f"<title>{title}</title>\n"
        "<style>body { margin: 1.5em; } pre { font: 14px/1.4 monospace; }</style>\n"
        f"</head>\n<body>\n<pre>{html.escape(table)}</pre>\n</body>\n</html>\n"
    )


ERROR_HEADER = re.compile(r"^Error in rule (\w+):")
# Snakemake's line when Ctrl-C reached it: the jobs it then reports as errors were stopped, not broken.
INTERRUPTED = "Terminating processes on user request"
FIELD = re.compile(r"^\s+(jobid|log|wildcards): (.+?)(?: \(check log file\(s\) for error details\))?$")


SnakemakeLog = str | Path | list[str | Path] | None
# A job's start and end in Snakemake's run log: a `[Sun Dec  6 07:36:47 2026]` line, then the rule line.
STAMP = re.compile(r"^\[(\w{3} \w{3} +\d{1,2} \d\d:\d\d:\d\d \d{4})\]$")
JOB_START = re.compile(r"^(?:local)?(?:rule|checkpoint) (\w+):$")
JOB_END = re.compile(r"^Finished jobid: \d+ \(Rule: (\w+)\)$")


def _log_lines(snakemake_log: SnakemakeLog) -> list[str]:
    """Snakemake's own run log (`log` in `onsuccess` / `onerror`: a list of paths in Snakemake 9)."""
    paths = [snakemake_log] if isinstance(snakemake_log, str | Path) else list(snakemake_log or [])
    return [line for path in paths if Path(path).is_file()
            for line in Path(path).read_text(errors="replace").splitlines()]


def _duration(seconds: float) -> str:
    minutes, seconds = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    if hours:
        return f"{hours} h {minutes:02d} min"
    return f"{minutes} min {seconds:02d} s" if minutes else f"{seconds} s"


def stage_times(snakemake_log: SnakemakeLog) -> str | None:
    """`time, this invocation: prompts 2 s (2 jobs), ...; all of it 4 min 32 s`: each stage from its first
    job's start to its last job's end, read from Snakemake's run log. Stages overlap where jobs ran side by
    side; a resumed run counts only what this invocation ran. None when it ran no job."""
    spans: dict[str, list] = {}  # rule -> [first start, last end, jobs finished]
    stamp = None
    for line in _log_lines(snakemake_log):
        if found := STAMP.match(line):
            stamp = datetime.strptime(" ".join(found[1].split()), "%a %b %d %H:%M:%S %Y")
        elif (start := JOB_START.match(line)) and stamp is not None:
            spans.setdefault(start[1], [stamp, stamp, 0])
        elif (end := JOB_END.match(line)) and stamp is not None and end[1] in spans:
            span = spans[end[1]]
            span[1], span[2] = max(span[1], stamp), span[2] + 1
    spans.pop("all", None)  # the target rule: no work of its own
    finished = {rule: span for rule, span in spans.items() if span[2]}
    if not finished:
        return None
    parts = [
        f"{rule} {_duration((end - start).total_seconds())} ({jobs} job{'s' if jobs > 1 else ''})"
        for rule, (start, end, jobs) in sorted(finished.items(), key=lambda item: item[1][0])
    ]
    whole = max(span[1] for span in finished.values()) - min(span[0] for span in finished.values())
    return f"time, this invocation: {', '.join(parts)}; all of it {_duration(whole.total_seconds())}"


STOPPING_OPTIONS = ("--until", "--omit-from")


def stopped_short_note(argv: list[str]) -> str | None:
    """A run cut by `--until` / `--omit-from` ends on Snakemake's `5 of 19 steps (26%) done`, counting the
    jobs it was told to leave out: say that it stopped where asked, and how to go on."""
    for index, word in enumerate(argv):
        if word in STOPPING_OPTIONS:
            named = []
            for item in argv[index + 1:]:
                if item.startswith("-"):
                    break
                named.append(item)
            where = ", ".join(named) or "the rules named"
            return (
                f"eaglepipe: stopped where {word} {where} asked (Snakemake's step count above includes "
                f"the jobs left out); the same command without {word} goes on from here"
            )
    return None


def failed_jobs(snakemake_log: SnakemakeLog) -> list[str]:
    """One line per failed (or Ctrl-C-stopped) job, from Snakemake's own run log: the rule, its wildcards
    (from the job's start block) and its log file."""
    lines = _log_lines(snakemake_log)
    wildcards: dict[str, str] = {}
    failures: list[dict[str, str]] = []
    jobid = None  # the job whose block the line is in
    for line in lines:
        header = ERROR_HEADER.match(line)
        if header:
            failures.append({"rule": header[1]})
        elif found := FIELD.match(line):
            key, value = found[1], found[2]
            if key == "jobid":
                jobid = value
            if failures and key in ("jobid", "log") and key not in failures[-1]:
                failures[-1][key] = value
            elif key == "wildcards" and jobid is not None:
                wildcards[jobid] = value
    ended = "stopped by Ctrl-C" if any(line.startswith(INTERRUPTED) for line in lines) else "failed"
    out = []
    for failure in failures:
        where = f" ({wildcards[failure['jobid']]})" if failure.get("jobid") in wildcards else ""
        log = failure.get("log", "no log file declared")
        out.append(f"eaglepipe: job {failure['rule']}{where} {ended}: see {log}")
    return out
