"""The plan as a person reads it: a table per set, the assumptions behind it, and what the budget buys."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from eaglepipe.hidden.storage import BYTES_PER_VALUE, STORED_LAYERS
from eaglepipe.openrouter.budget import MIN_OBSERVATIONS
from eaglepipe.plan.estimate import BYTES_PER_TOKEN, shard_bytes_per_token
from eaglepipe.plan.model import UNKNOWN, SetPlan, SpendPlan

HEADER = "eaglepipe spend plan (no request sent, no key read; the same plan prints before a real run spends)"
EMULATED = (
    "This is the emulator's plan (api.base_url: local): its providers and dollars are simulated and nothing "
    "is bought; 'unknown' only means the demo's prompt sets are not built yet."
)


def format_plan(plan: SpendPlan) -> str:
    header = f"{HEADER}\nresults root: {plan.results}/ (its per-set folders, providers.json and ledger only)"
    if plan.emulated:
        header += f"\n{EMULATED}"
    if not plan.has_work:
        return f"{header}\nnothing left to buy: every planned set has its responses and hidden states"
    columns = ["set", "status", "prompts", "left", "input tok", "per answer", "output tok", "dollars",
               "budget", "shard disk"]
    rows = [_row(item, plan) for item in plan.sets]
    rows.append(_total_row(plan))
    widths = [max(len(row[i]) for row in [columns, *rows]) for i in range(len(columns))]
    table = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
             for row in [columns, *rows]]
    return "\n".join([header, *_notes(plan), *table, *_summary(plan)])


def _row(item: SetPlan, plan: SpendPlan) -> list[str]:
    if item.status == "done":
        return [item.name, "done", *["-"] * 8]
    if item.status == "extract":
        return [item.name, "extract", *["-"] * 7, _size(item.disk_bytes)]
    output = _count(item.output_tokens) + (" (cap)" if item.capped else "")
    return [
        item.name,
        item.status,
        _count(item.prompts),
        _count(item.left),
        _count(item.input_tokens),
        f"{item.per_answer:,} {item.per_answer_source}",
        output,
        _usd_range(_dollar_range(item, plan), item.usd_at_least),
        item.coverage + ("?" if item.usd_at_least and item.coverage in ("full", "partly") else ""),
        _disk(item),
    ]


def _dollar_range(item: SetPlan, plan: SpendPlan) -> tuple[float | None, float | None]:
    """(at the per-answer estimate, at max_tokens per answer): the token budget bounds both, and a set
    answered at max_tokens reaches it after fewer prompts, so fewer input tokens: the high end holds."""
    if item.source != "openrouter":
        return 0.0, 0.0
    if item.usd is None or plan.prices is None or item.left is None:
        return item.usd, None
    capped = item.output_tokens if item.capped else None  # a capped set's output tokens are known
    most = capped if capped is not None else item.left * plan.max_tokens
    return item.usd, plan.prices.cost(item.input_tokens or 0, max(most, item.output_tokens or 0))


def _usd_range(bounds: tuple[float | None, float | None], outputs_only: bool) -> str:
    low, high = bounds
    text = _usd(low) if high is None or _usd(high) == _usd(low) else f"{_usd(low)}-{_usd(high)}"
    return text + (" +input" if outputs_only and low is not None else "")


def _disk(item: SetPlan) -> str:
    """The set's shards: definite once its input tokens are counted, else the outputs' share ('>=')."""
    if item.disk_bytes is None:
        return UNKNOWN
    return (">=" if item.disk_at_least else "") + _size(item.disk_bytes)


def _total_row(plan: SpendPlan) -> list[str]:
    buying = [item for item in plan.sets if item.status == "generate"]
    extracting = [item for item in plan.sets if item.status != "done"]
    ranges = [_dollar_range(item, plan) for item in buying]
    high = _sum(high for _, high in ranges) if ranges and all(h is not None for _, h in ranges) else None
    disk = _size(_sum(item.disk_bytes for item in extracting))
    if disk != UNKNOWN and any(item.disk_at_least for item in extracting):
        disk = ">=" + disk
    return [
        "total",
        "",
        _count(_sum(item.prompts for item in buying)),
        _count(_sum(item.left for item in buying)),
        _count(_sum(item.input_tokens for item in buying)),
        "",
        _count(_sum(item.output_tokens for item in buying)),
        _usd_range((_sum(item.usd for item in buying), high), any(item.usd_at_least for item in buying)),
        "",
        disk,
    ]


def _notes(plan: SpendPlan) -> list[str]:
    """How the columns were estimated, each assumption with the config key that sets it."""
    if not any(item.status == "generate" for item in plan.sets):
        return [""]
    if plan.prices is None:
        price = (
            "price: unknown (no providers.json for this model yet and no budget.price_per_m_tokens)"
        )
    else:
        price = (
            f"price: ${plan.prices.prompt * 1e6:,.4g}/M input, ${plan.prices.completion * 1e6:,.4g}/M output "
            f"({plan.prices.source})"
        )
    tokenizer = plan.target_dir / "tokenizer.json"
    inputs = {
        "tokenizer": f"input tokens: counted with {tokenizer}, chat template applied",
        "bytes": f"input tokens: prompt JSON bytes / {BYTES_PER_TOKEN} (no usable {tokenizer})",
        None: "input tokens: unknown until the prompt sets are built (free: `snakemake --until prompts`)",
    }[plan.input_method]
    answer = (
        f"per answer: 'config' = generation.expected_completion_tokens (an assumption), 'journal' = the mean "
        f"of >= {MIN_OBSERVATIONS} answers already bought; at most generation.max_tokens {plan.max_tokens:,}"
    )
    dollars = (
        "dollars: low at the per-answer estimate, high if every answer ran to generation.max_tokens"
    )
    notes = [price, inputs, answer, dollars]
    if any(item.usd_at_least for item in plan.sets):
        notes.append("'+input' dollars and '>=' disk: outputs only, for sets whose prompts are not built yet")
    if any(item.capped for item in plan.sets):
        notes.append("(cap): budget.output_tokens_per_dataset ends the set first (journal answers count)")
    return [*notes, ""]


def _summary(plan: SpendPlan) -> list[str]:
    buying = [item for item in plan.sets if item.status == "generate" and item.source == "openrouter"]
    unbought = [item for item in plan.sets if item.status == "generate" and item.source != "openrouter"]
    outputs_only = any(item.usd_at_least for item in buying)
    lines = [
        "",
        f"budget.usd ${plan.budget_usd:,.2f}: ${plan.spent_usd:,.4f} spent so far, "
        f"${plan.remaining_usd:,.2f} left. The budget column assumes sets are bought one after another in "
        "`datasets` order at the low estimate; generation jobs may run at once and share budget.usd, so "
        "the set left short can be any of them"
        + ("; '?': outputs only, the inputs may cut it" if outputs_only else ""),
    ]
    for coverage, label in (("full", "covers fully"), ("partly", "covers partly"), ("no", "does not cover"),
                            (UNKNOWN, "cannot price")):
        names = [item.name for item in buying if item.coverage == coverage]
        if names:
            lines.append(f"  {label}: {', '.join(names)}")
    if unbought:
        named = ", ".join(f"{item.name} ({item.source})" for item in unbought)
        lines.append(f"  not bought, $0: {named}")
    if plan.hidden_size is None:
        lines.append(
            "shard disk: unknown: no hidden_size in the target's config.json yet; set target.hidden_size "
            "to plan it"
        )
    else:
        per_token = shard_bytes_per_token(plan.hidden_size, plan.dtype)
        caps = plan.hidden_caps
        lines.append(
            f"shard disk: tokens x {STORED_LAYERS} layers x hidden {plan.hidden_size:,} "
            f"({plan.hidden_size_source}) x {BYTES_PER_VALUE[plan.dtype]} B (hidden.dtype {plan.dtype}), "
            f"with ids, masks{' and fp8 scales' if plan.dtype == 'fp8' else ''}: {per_token:,} B per token"
            + (f"; per set at most {caps}" if caps else "")
        )
    return [*lines, _what_it_buys(plan, buying)]


def _what_it_buys(plan: SpendPlan, buying: list[SetPlan]) -> str:
    """The one sentence a person deciding to spend needs: what this budget buys and what it does not."""
    if plan.emulated:
        return (
            "In short: the emulator buys nothing and charges nothing real; this run builds the whole chain "
            "on the CPU for $0."
        )
    full = [item.name for item in buying if item.coverage == "full"]
    short = [item.name for item in buying if item.coverage in ("partly", "no")]
    unpriced = [item.name for item in buying if item.coverage == UNKNOWN]
    if unpriced:
        return (
            f"In short: this budget cannot be checked against {', '.join(unpriced)} until they can be priced "
            "(providers.json or budget.price_per_m_tokens); every set must be complete for a drafter."
        )
    if not short:
        caveat = " if the inputs fit" if any(item.usd_at_least for item in buying) else ""
        left = ", ".join(full) or "none"
        return f"In short: ${plan.remaining_usd:,.2f} buys every set left ({left}){caveat}, so the drafter."
    bought = f"buys {', '.join(full)} in full but not {', '.join(short)}" if full else (
        f"buys none of {', '.join(short)} in full"
    )
    return (
        f"In short: ${plan.remaining_usd:,.2f} {bought}; training needs every set in `datasets`, so this "
        "budget buys no drafter: raise budget.usd or list fewer sets."
    )


def _sum(values: Iterable[int | float | None]) -> Any:
    """None (unknown) as soon as one part is unknown: a partial total would read as the whole."""
    values = list(values)
    return None if any(value is None for value in values) else sum(values)


def _count(value: int | None) -> str:
    return UNKNOWN if value is None else f"{value:,}"


def _usd(value: float | None) -> str:
    if value is None:
        return UNKNOWN
    return f"${value:,.2f}" if value >= 1 else f"${value:.4f}"


def _size(value: float | None) -> str:
    if value is None:
        return UNKNOWN
    for unit in ("B", "kB", "MB", "GB"):
        if value < 1000:
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1000
    return f"{value:,.1f} TB"
