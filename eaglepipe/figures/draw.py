"""The report's figures, one PNG each, drawn with matplotlib from what the stages wrote.

Every figure is drawn even when its data is missing or empty (a panel then says so), so the figures rule
always has all its outputs and a report never shows a broken image.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

import matplotlib

matplotlib.use("Agg")  # files only: no display on a cluster node
matplotlib.rcParams["text.parse_math"] = False  # dollar signs are dollars, not TeX

import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.axes import Axes  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

from eaglepipe.figures.data import RunOutputs, hidden_bytes  # noqa: E402
from eaglepipe.figures.summary import METHOD_LABELS  # noqa: E402

if TYPE_CHECKING:  # the figures import no torch
    from eaglepipe.drafter.evaluate import MethodReport

DPI = 110
DISK_UNITS = (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3))
BUDGET_LINE_SHARE = 0.05  # below this share of budget.usd spent, the budget line is named, not drawn
METHOD_COLOURS = {"eagle3": "tab:blue", "eagle3_untrained": "tab:gray", "prompt_lookup": "tab:orange"}
# tokens.json shares, in the order the bar stacks them (docs/tokens.md says what each means).
ID_SHARES = {
    "exact": "exact (server ids)",
    "rebuilt_count_matched": "rebuilt, count matches bill",
    "rebuilt_ambiguous": "rebuilt, ambiguous",
    "rebuilt_segmentation_only": "rebuilt, only the split differs",
    "rebuilt_off_by_k": "rebuilt, off by k tokens",
}


def _empty(ax: Axes, why: str) -> None:
    ax.text(0.5, 0.5, why, ha="center", va="center", transform=ax.transAxes, color="gray")
    ax.set_xticks([])
    ax.set_yticks([])


def _grid(count: int) -> tuple[Figure, list[Axes]]:
    """Small multiples, one panel per set, at most four across."""
    cols = min(max(count, 1), 4)
    rows = math.ceil(max(count, 1) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.4 * cols, 2.6 * rows + 0.6), squeeze=False)
    flat = list(axes.flat)
    for ax in flat[count:]:
        ax.set_visible(False)
    return fig, flat


def answer_lengths(run: RunOutputs, max_tokens: int) -> Figure:
    fig, axes = _grid(len(run.sets))
    for ax, item in zip(axes, run.sets, strict=False):
        # An answer without a count would show as length 0: it is left out of the histogram.
        lengths = [a.completion_tokens for a in item.answers or [] if a.completion_tokens is not None]
        ax.set_title(item.name, fontsize=10)
        if not lengths:
            _empty(ax, "no answer with a token count" if item.answers else "no answers")
            continue
        ax.hist(lengths, bins=min(30, max(5, len(set(lengths)))), color="tab:blue")
        ax.axvline(max_tokens, color="tab:red", linestyle="--", label=f"max_tokens {max_tokens}")
        ax.set_xlabel("output tokens per answer")
        ax.set_ylabel("answers")
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
        ax.legend(fontsize=7)
    fig.suptitle("Answer lengths per set (answers at the red line were truncated)")
    return fig


def finish_reasons(run: RunOutputs) -> Figure:
    counts = {item.name: Counter(answer.finish_reason for answer in item.answers or []) for item in run.sets}
    reasons = sorted({reason for counter in counts.values() for reason in counter})
    fig, ax = plt.subplots(figsize=(7, 0.5 * len(run.sets) + 1.8))
    if not reasons:
        _empty(ax, "no answers")
    left = [0] * len(run.sets)
    for reason in reasons:
        widths = [counts[item.name][reason] for item in run.sets]
        ax.barh([item.name for item in run.sets], widths, left=left, label=reason)
        left = [a + b for a, b in zip(left, widths, strict=True)]
    if reasons:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel("answers")
        ax.legend(title="finish_reason", fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))
        ax.invert_yaxis()
    ax.set_title("How answers ended (length = cut at generation.max_tokens)")
    return fig


def spend_over_time(run: RunOutputs, budget_usd: float) -> Figure:
    fig, (dollars_ax, tokens_ax) = plt.subplots(2, 1, figsize=(7, 5), sharex=True)
    if not run.ledger:
        _empty(dollars_ax, "no billed request in the ledger")
        _empty(tokens_ax, "")
        return fig
    times = [datetime.fromtimestamp(r.get("at") or 0.0, UTC) for r in run.ledger]
    dollars, tokens, usd, count = [], [], 0.0, 0
    for record in run.ledger:
        usd += float(record.get("usd") or 0.0)
        count += int(record.get("completion_tokens") or 0)
        dollars.append(usd)
        tokens.append(count)
    dollars_ax.step(times, dollars, where="post", color="tab:green", label="spent (ledger)")
    if usd >= BUDGET_LINE_SHARE * budget_usd:
        dollars_ax.axhline(budget_usd, color="tab:red", linestyle="--", label=f"budget.usd ${budget_usd:g}")
    else:  # the line would flatten the spend into the axis
        dollars_ax.plot([], [], " ", label=f"budget.usd ${budget_usd:g}: far above, not drawn")
    dollars_ax.set_ylabel("dollars, cumulative")
    dollars_ax.legend(fontsize=8)
    tokens_ax.step(times, tokens, where="post", color="tab:blue")
    tokens_ax.set_ylabel("output tokens, cumulative")
    tokens_ax.set_xlabel("time (UTC)")
    fig.autofmt_xdate()
    fig.suptitle(f"Spend over time: ${usd:.4f} of ${budget_usd:g}, {count:,} output tokens")
    return fig


def token_id_methods(run: RunOutputs) -> Figure:
    fig, ax = plt.subplots(figsize=(7, 0.5 * len(run.sets) + 2))
    names = [item.name for item in run.sets]
    shares = {item.name: item.token_stats.get("shares", {}) for item in run.sets}
    left = [0.0] * len(names)
    for key, label in ID_SHARES.items():
        widths = [100 * (shares[name].get(key) or 0.0) for name in names]
        ax.barh(names, widths, left=left, label=label)
        left = [a + b for a, b in zip(left, widths, strict=True)]
    flagged = [sum((item.token_stats.get("counts", {}).get("flags") or {}).values()) for item in run.sets]
    for y, count in enumerate(flagged):
        ax.text(101, y, f"{count} flags", va="center", fontsize=8)
    ax.set_xlim(0, 115)
    ax.set_xlabel("% of responses")
    ax.invert_yaxis()
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.3), ncol=2)
    ax.set_title("How the completion token ids were obtained")
    return fig


def training_yield(run: RunOutputs) -> Figure:
    """From dollars to trained tokens: what the run was billed (every request in the ledger, failures
    included), what its kept answers cost, and what of them the token stage trained on; beside it, per set,
    the output tokens bought and trained on, the rest named by cause."""
    fig, (money, tokens) = plt.subplots(1, 2, figsize=(11, 0.5 * len(run.sets) + 2.6))
    yields = {item.name: item.token_stats.get("yield") or {} for item in run.sets}
    billed = sum(line.get("usd") or 0.0 for line in run.ledger)
    kept = sum(y.get("bought_usd") or 0.0 for y in yields.values())
    trained = sum(y.get("trained_usd") or 0.0 for y in yields.values())
    if not any(yields.values()):
        _empty(money, "no set tokenized yet")
        _empty(tokens, "no set tokenized yet")
        return fig
    steps = ["billed (ledger)", "kept answers", "trained on"]
    values = [billed, kept, trained]
    money.barh(steps, values, color=["tab:gray", "tab:blue", "tab:green"])
    for y, value in enumerate(values):
        share = f" ({100 * value / values[0]:.1f}%)" if values[0] else ""
        money.text(value, y, f" ${value:,.4f}{share}", va="center", fontsize=8)
    money.invert_yaxis()
    money.set_xlim(0, max(values) * 1.45 or 1)
    money.set_xlabel("dollars")
    money.set_title("Dollars to training (the run)")
    names = list(yields)
    bought = [yields[name].get("bought_tokens") or 0 for name in names]
    used = [yields[name].get("trained_tokens") or 0 for name in names]
    tokens.barh(names, bought, color="tab:gray", label="bought output tokens")
    tokens.barh(names, used, color="tab:green", label="trained on")
    for y, name in enumerate(names):
        causes = ", ".join(
            f"{cause} {figures['tokens']:,}" for cause, figures in (yields[name].get("dropped") or {}).items()
        )
        share = f"{100 * used[y] / bought[y]:.1f}%" if bought[y] else "-"
        label = f" {share}" + (f" (not: {causes})" if causes else "")
        tokens.text(bought[y], y, label, va="center", fontsize=7)
    tokens.invert_yaxis()
    tokens.set_xlim(0, max(bought) * 1.6 or 1)
    tokens.set_xlabel("output tokens")
    tokens.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.25), ncol=2)
    tokens.set_title("Output tokens to training, per set")
    return fig


def billed_difference(run: RunOutputs) -> Figure:
    fig, axes = _grid(len(run.sets))
    for ax, item in zip(axes, run.sets, strict=False):
        histogram = (item.token_stats.get("billed") or {}).get("rebuilt_minus_billed_histogram") or {}
        ax.set_title(item.name, fontsize=10)
        if not histogram:
            _empty(ax, "no billed counts")
            continue
        diffs = sorted(histogram, key=int)
        ax.bar([int(d) for d in diffs], [histogram[d] for d in diffs], color="tab:purple")
        ax.set_xlim(min(-3, int(diffs[0]) - 1), max(3, int(diffs[-1]) + 1))
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel("rebuilt minus billed tokens")
        ax.set_ylabel("responses")
    fig.suptitle("Rebuilt minus billed completion tokens (0: the ids match the bill in length)")
    return fig


def hidden_states(run: RunOutputs) -> Figure:
    fig, (tokens_ax, disk_ax) = plt.subplots(1, 2, figsize=(9, 0.45 * len(run.sets) + 2))
    names = [item.name for item in run.sets]
    tokens = [item.hidden.get("num_tokens", 0) if item.hidden else 0 for item in run.sets]
    disk = [hidden_bytes(item.hidden) if item.hidden else 0 for item in run.sets]
    unit, scale = next(((u, s) for u, s in DISK_UNITS if max(disk, default=0) >= s), DISK_UNITS[-1])
    tokens_ax.barh(names, tokens, color="tab:blue")
    tokens_ax.set_xlabel("tokens")
    tokens_ax.invert_yaxis()
    disk_ax.barh(names, [d / scale for d in disk], color="tab:brown")
    disk_ax.set_xlabel(f"{unit} of shards")
    disk_ax.invert_yaxis()
    disk_ax.set_yticklabels([])
    fig.suptitle(f"Hidden states: {sum(tokens):,} tokens, {sum(disk) / scale:,.3g} {unit} on disk")
    return fig


def training(run: RunOutputs) -> Figure:
    fig, (loss_ax, accuracy_ax) = plt.subplots(1, 2, figsize=(10, 3.6))
    train = run.train
    curve = (train.get("loss_curve") if train else None) or []
    if curve:
        loss_ax.plot([p["step"] for p in curve], [p["loss"] for p in curve], marker="o", markersize=3)
        loss_ax.set_xlabel("optimizer step")
        loss_ax.set_ylabel("TTT loss")
    else:
        _empty(loss_ax, "no train.json")
    loss_ax.set_title("Training loss")
    accuracy = (train.get("ttt_accuracy") if train else None) or []
    if accuracy:
        steps = range(1, len(accuracy) + 1)
        bars = accuracy_ax.bar(steps, [100 * (a or 0.0) for a in accuracy], color="tab:green")
        accuracy_ax.bar_label(bars, fmt="%.1f%%", fontsize=8)
        accuracy_ax.set_xticks(list(steps))
        accuracy_ax.set_xlabel("unroll step (draft position)")
        accuracy_ax.set_ylabel("top-1 accuracy, %")
        accuracy_ax.set_ylim(0, 100)
    else:
        _empty(accuracy_ax, "no train.json")
    window = train.get("ttt_accuracy_window_steps") if train else None
    accuracy_ax.set_title(f"TTT accuracy (last {window} steps)" if window else "TTT accuracy")
    return fig


def acceptance(run: RunOutputs) -> Figure:
    """Acceptance length per set (from the per-prompt entries) and overall, for each method."""
    evaluation = run.eval
    methods = (evaluation.get("methods") if evaluation else None) or {}
    fig, ax = plt.subplots(figsize=(8, 3.8))
    if not methods:
        _empty(ax, "no eval.json")
        return fig
    groups = [item.name for item in run.sets] + ["all held-out"]
    width = 0.8 / len(methods)
    for offset, (name, result) in enumerate(methods.items()):
        values = [_set_acceptance(result, group) for group in groups[:-1]]
        values.append(result["acceptance_length"] or 0.0)
        xs = [i + (offset - (len(methods) - 1) / 2) * width for i in range(len(groups))]
        ax.bar(xs, values, width, label=METHOD_LABELS.get(name, name), color=METHOD_COLOURS.get(name))
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks(range(len(groups)), groups, rotation=20, ha="right", fontsize=8)
    ax.set_ylabel("tokens per target forward")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))
    held_out = evaluation.get("held_out_prompts", "?") if evaluation else "?"
    ax.set_title(f"Acceptance length on {held_out} held-out prompts (1.0: no gain)")
    return fig


def _set_acceptance(result: MethodReport, dataset: str) -> float:
    entries = [e for e in result.get("per_prompt", []) if e.get("set") == dataset]
    forwards = sum(e["target_forwards"] for e in entries)
    return sum(e["tokens"] for e in entries) / forwards if forwards else 0.0


def acceptance_by_position(run: RunOutputs) -> Figure:
    methods = (run.eval.get("methods") if run.eval else None) or {}
    fig, ax = plt.subplots(figsize=(6, 3.6))
    rates = {name: result.get("acceptance_rate_per_position") for name, result in methods.items()}
    if not any(rates.values()):
        _empty(ax, "no per-position acceptance in eval.json")
        return fig
    for name, values in rates.items():
        positions = range(1, len(values) + 1)
        ax.plot(positions, [100 * (v or 0.0) for v in values], marker="o",
                label=METHOD_LABELS.get(name, name), color=METHOD_COLOURS.get(name))
        ax.set_xticks(list(positions))
    ax.set_xlabel("draft position k")
    ax.set_ylabel("% of verify forwards accepting drafts 1..k")
    ax.set_ylim(0, 100)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))
    ax.set_title("Acceptance per draft position")
    return fig


def figure_makers(max_tokens: int, budget_usd: float) -> dict[str, Callable[[RunOutputs], Figure]]:
    """Every figure by its file stem; the figures rule declares exactly these outputs."""
    return {
        "generation_answer_lengths": lambda run: answer_lengths(run, max_tokens),
        "generation_finish_reasons": finish_reasons,
        "generation_spend": lambda run: spend_over_time(run, budget_usd),
        "tokens_id_methods": token_id_methods,
        "tokens_billed_difference": billed_difference,
        "tokens_yield": training_yield,
        "hidden_states": hidden_states,
        "drafter_training": training,
        "drafter_acceptance": acceptance,
        "drafter_acceptance_by_position": acceptance_by_position,
    }



def draw_figures(run: RunOutputs, outputs: dict[str, Path], *, max_tokens: int, budget_usd: float) -> None:
    """Draw each figure named in `outputs` (stem -> PNG path)."""
    makers = figure_makers(max_tokens, budget_usd)
    for stem, path in outputs.items():
        fig = makers[stem](run)
        fig.tight_layout()
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=DPI, bbox_inches="tight")  # legends beside the axes stay in
        plt.close(fig)
