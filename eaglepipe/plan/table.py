"""The plan as a person reads it: a table per set, the assumptions behind it, and what the budget buys."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from eaglepipe.hidden.storage import STORED_LAYERS, value_cost
from eaglepipe.openrouter.budget import MIN_OBSERVATIONS
from eaglepipe.plan.estimate import BYTES_PER_TOKEN, shard_bytes_per_token
from eaglepipe.plan.hours import Hours
from eaglepipe.plan.model import UNKNOWN, SetPlan, SpendPlan

HEADER = "eaglepipe spend plan (no request sent, no key read; the same plan prints before a real run spends)"
EMULATED = (
    "This is the emulator's plan (api.base_url: local): its providers and dollars are simulated and nothing "
    "is bought"
)
UNBUILT = "; 'unknown' only means the demo's prompt sets are not built yet"


def format_plan(plan: SpendPlan) -> str:
    header = f"{HEADER}\nresults root: {plan.results}/ (its per-set folders, providers.json and ledger only)"
    if plan.emulated:
        unbuilt = any(item.usd_at_least or item.disk_at_least for item in plan.sets)
        header += f"\n{EMULATED}{UNBUILT if unbuilt else ''}."
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
        _coverage(item) + ("?" if item.usd_at_least and item.coverage in ("full", "partly") else ""),
        _disk(item),
    ]


def _coverage(item: SetPlan) -> str:
    """full, no, or the share of the set's answers a partly covering budget buys (33%)."""
    if item.coverage != "partly" or not item.output_tokens or item.bought_output_tokens is None:
        return item.coverage
    return f"{max(1, round(100 * item.bought_output_tokens / item.output_tokens))}%"


def _dollar_range(item: SetPlan, plan: SpendPlan) -> tuple[float | None, float | None]:
    """(at the per-answer estimate, at max_tokens per answer): the token budget bounds both, and a set
    answered at max_tokens reaches it after fewer prompts, so fewer input tokens: the high end holds."""
    if not item.bought:
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
        None: "input tokens: unknown until the prompt sets are built (free: `.venv/bin/snakemake --until "
        "prompts`)",
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
    buying = [item for item in plan.sets if item.to_buy]
    unbought = [item for item in plan.sets if item.status == "generate" and not item.bought]
    outputs_only = any(item.usd_at_least for item in buying)
    spent = (
        f"budget.usd ${plan.budget_usd:,.2f}: ${plan.spent_usd:,.4f} spent so far, "
        f"${plan.remaining_usd:,.2f} left"
    )
    if plan.policy == "share" and plan.share_usd is None:
        how = "no set of this run is bought (its answers come from files or an engine): budget.usd is unused"
    elif plan.share_usd is not None:
        how = (
            f"budget.policy share: each of the run's bought sets may spend ${plan.share_usd:,.2f}, and one "
            "its share stops is complete for now with what it bought (its summary: partial: dollar_budget); "
            "the budget column is the part of each set that buys"
        )
    else:
        how = (
            "budget.policy in_order: the budget column assumes sets are bought one after another in "
            "`datasets` order at the low estimate; generation jobs may run at once and share budget.usd, so "
            "the set left short can be any of them, and it fails until budget.usd is raised"
        )
    lines = ["", f"{spent}. {how}" + ("; '?': outputs only, the inputs may cut it" if outputs_only else "")]
    for coverage, label in (("full", "covers fully"), ("partly", "covers partly"), ("no", "does not cover"),
                            (UNKNOWN, "cannot price")):
        names = [item.name + (f" ({_coverage(item)})" if coverage == "partly" else "")
                 for item in buying if item.coverage == coverage]
        if names:
            lines.append(f"  {label}: {', '.join(names)}")
    if unbought:
        named = ", ".join(f"{item.name} ({item.source.value})" for item in unbought)
        lines.append(f"  not bought, $0: {named}")
    lines.extend(_too_small_for_one_request(plan, buying))
    lines.append(_yield_line(plan, buying))
    lines.append(_shard_line(plan))
    lines.extend(_hour_lines(plan))
    return [*lines, _what_it_buys(plan, buying)]


def _too_small_for_one_request(plan: SpendPlan, buying: list[SetPlan]) -> list[str]:
    """Until answers are priced, a request is admitted only while its worst case (max_tokens at the dearest
    output price) fits what the set may spend: a budget below that starts nothing."""
    if plan.prices is None or not buying:
        return []
    worst = plan.prices.completion * plan.max_tokens
    may_spend = plan.share_usd if plan.share_usd is not None else plan.remaining_usd
    if may_spend >= worst:
        return []
    what = "each set's share" if plan.share_usd is not None else "what is left of budget.usd"
    return [
        f"warning: {what} (${may_spend:,.4f}) is below one request's worst case (${worst:,.4f}: "
        f"generation.max_tokens {plan.max_tokens:,} at the dearest output price), so no request starts: "
        "raise budget.usd or lower generation.max_tokens"
    ]


def _yield_line(plan: SpendPlan, buying: list[SetPlan]) -> str:
    """What share of what is bought is expected to reach training, from the sets tokenized so far."""
    if plan.measured_yield is None:
        return (
            "to training: unknown until a set is tokenized (its tokens.json `yield`: the share of bought "
            "output tokens the token stage keeps)"
        )
    tokens = _sum(item.bought_output_tokens for item in buying)
    expected = ""
    if isinstance(tokens, int) and tokens:
        trained = _millions(round(tokens * plan.measured_yield))
        expected = f"; of the {_millions(tokens)} output tokens to buy, about {trained} would be trained on"
    return (
        f"to training: {100 * plan.measured_yield:.1f}% of the output tokens bought so far reached training "
        f"({_sets(plan.yield_sets)} tokenized){expected}"
    )


def _shard_line(plan: SpendPlan) -> str:
    if plan.hidden_size is None:
        return (
            "shard disk: unknown: no hidden_size in the target's config.json yet; set target.hidden_size "
            "to plan it"
        )
    per_token = shard_bytes_per_token(plan.hidden_size, plan.dtype)
    caps = plan.hidden_caps
    return (
        f"shard disk: tokens x {STORED_LAYERS} layers x hidden {plan.hidden_size:,} "
        f"({plan.hidden_size_source}) x {value_cost(plan.dtype)} (hidden.dtype {plan.dtype}), "
        f"with ids and masks: {per_token:,} B per token"
        + (f"; per set at most {caps}" if caps else "")
        + "; at what the budget buys"
    )


def _hour_lines(plan: SpendPlan) -> list[str]:
    """Time beside dollars and disk, each figure with the rate it rests on and the key that sets it."""
    hours = plan.hours
    if hours is None:
        return []
    lines = []
    if any(item.status == "generate" for item in plan.sets):
        rate = (
            f"{hours.concurrency:,} in flight (generation.concurrency) x {hours.tokens_per_s_per_request:g} "
            "output tokens/s each (plan.tokens_per_s_per_request)"
        )
        took = UNKNOWN if hours.generation_s is None else f"about {_duration(hours.generation_s)}"
        if plan.emulated:
            lines.append("time, generation: the local emulator's pace on this machine, not a provider's; the "
                         "demo's times are in the README")
        else:
            lines.append(f"time, generation: {took} at {rate}; rate limits and retries only add to it")
    left = [item for item in plan.sets if item.status != "done"]
    if plan.goal in ("drafter", "hidden states") and left:
        lines.append("time, hidden states: " + _gpu_hours(
            hours.hidden_gpu_h, hours.hidden_gpus, "hidden.gpus", hours.hidden_on_cpu, "hidden.device",
            f"2 FLOPs per token x {_params(hours.active_parameters)} active parameters "
            f"({hours.active_parameters_source or 'unknown: set target.active_parameters'})",
            hours.gpu_tflops,
        ) + ("" if hours.hidden_on_cpu else _loading(hours, len(left), plan.target_dir)))
    if plan.goal == "drafter":
        lines.append("time, training: " + _gpu_hours(
            hours.train_gpu_h, hours.train_gpus, "drafter.gpus", hours.train_on_cpu, "drafter.device",
            f"6 FLOPs per token x {_params(hours.drafter_parameters)} draft parameters x drafter.ttt_length, "
            "x drafter.epochs, plus the target's LM head"
            + (
                f" (from {hours.active_parameters_source})"
                if hours.drafter_parameters
                else f" (unknown until {plan.target_dir}/config.json exists)"
            ),
            hours.gpu_tflops,
        ))
    total = _total_time_line(plan, buys=any(item.status == "generate" for item in plan.sets), loads=len(left))
    if total:
        lines.append(total)
    return lines


def _total_time_line(plan: SpendPlan, *, buys: bool, loads: int) -> str | None:
    """The whole run's time from now to the drafter: the stage times above, one after another. Only for a
    run that buys from a provider and computes on GPUs: the demo's times are measured, in the README."""
    hours = plan.hours
    if hours is None or plan.emulated or hours.hidden_on_cpu or hours.train_on_cpu or plan.goal != "drafter":
        return None
    stages: list[tuple[str, float | None]] = []
    if buys:
        stages.append(("generation", hours.generation_s))
    if loads:
        hidden = None if hours.hidden_gpu_h is None else hours.hidden_gpu_h * 3600 / hours.hidden_gpus
        loading = None if hours.load_s_per_job is None else hours.load_s_per_job * loads
        stages += [("hidden states", hidden), ("loading the target", loading)]
    train = None if hours.train_gpu_h is None else hours.train_gpu_h * 3600 / hours.train_gpus
    stages.append(("training", train))
    known = [(name, seconds) for name, seconds in stages if seconds is not None]
    unknown = [name for name, seconds in stages if seconds is None]
    if not known:
        return None
    parts = ", ".join(f"{name} {_duration(seconds)}" for name, seconds in known)
    parts += "".join(f"; {name} {UNKNOWN}" for name in unknown)
    return (
        f"time, in all: {'at least' if unknown else 'about'} {_duration(sum(s for _, s in known))} until the "
        f"drafter, the stages one after another ({parts}); a set that has its answers goes on to its hidden "
        "states while others still buy, so the run can end sooner"
    )


def _loading(hours: Hours, jobs: int, target_dir: Path) -> str:
    """Each set's hidden-state job loads the whole target first: for a 1T-parameter model, minutes a job."""
    if hours.load_s_per_job is None:
        return f"; plus loading the target in each of {jobs} jobs (unknown until {target_dir} has it)"
    return (
        f"; plus loading the target in each of {jobs} jobs: {_duration(hours.load_s_per_job)} each at "
        f"{hours.load_gb_per_s:g} GB/s (plan.load_gb_per_s), {_duration(hours.load_s_per_job * jobs)} in all"
    )


def _gpu_hours(gpu_h: float | None, gpus: int, gpus_key: str, on_cpu: bool, device_key: str, flops: str,
               tflops: float) -> str:
    if on_cpu:
        return f"on the CPU ({device_key} cpu): no GPU hours; the demo's times are in the README"
    if gpu_h is None:
        return f"unknown ({flops})"
    return (
        f"about {gpu_h:,.1f} GPU-hours, {_duration(gpu_h * 3600 / gpus)} on {gpus} GPU(s) ({gpus_key}): "
        f"{flops}, at {tflops:g} TFLOP/s a GPU (plan.gpu_tflops)"
    )


def _what_it_buys(plan: SpendPlan, buying: list[SetPlan]) -> str:
    """The one sentence a person deciding to spend needs: what this budget buys, and what the command then
    builds of it."""
    sentence = _what_it_buys_in_short(plan, buying)
    if plan.emulated:
        return sentence.replace("In short:", "In short (the emulator's dollars; nothing real is bought):", 1)
    return sentence


def _what_it_buys_in_short(plan: SpendPlan, buying: list[SetPlan]) -> str:
    then = _then(plan)
    if not buying:
        built = "a drafter" if plan.goal == "drafter" else then.removeprefix("then ")
        return f"In short: nothing left to buy; the run goes on to {built}."
    full = [item.name for item in buying if item.coverage == "full"]
    short = [item for item in buying if item.coverage in ("partly", "no")]
    unpriced = [item.name for item in buying if item.coverage == UNKNOWN]
    if unpriced:
        return (
            f"In short: this budget cannot be checked against {', '.join(unpriced)} until they can be priced "
            "(providers.json or budget.price_per_m_tokens)."
        )
    outputs_only = any(item.usd_at_least for item in buying)
    caveat = " if the inputs fit" if outputs_only else ""
    inputs_unknown = " (less the inputs' cost, unknown until the prompts are built)" if outputs_only else ""
    if not short:
        left = ", ".join(full)
        return f"In short: ${plan.remaining_usd:,.2f} buys every set left ({left}){caveat}, {then}."
    bought = _sum(item.bought_output_tokens for item in buying)
    wanted = _sum(item.output_tokens for item in buying)
    tokens = f"{_millions(bought)} of {_millions(wanted)} output tokens"
    if plan.share_usd is not None:
        empty = [item.name for item in short if item.coverage == "no" and not item.done_samples]
        if empty:
            whose = "its" if len(empty) == 1 else "their"
            return (
                f"In short: {', '.join(empty)} spent {whose} ${plan.share_usd:,.2f} share of budget.usd with "
                f"no answer to show, so no {plan.goal} from this run: raise budget.usd."
            )
        return (
            f"In short: with ${plan.budget_usd:,.2f}: {_sets(len(buying))} x up to ${plan.share_usd:,.2f} "
            f"each, {tokens}{inputs_unknown}, {then}; raising budget.usd later buys the rest and rebuilds "
            "what depends on it."
        )
    cut = ", ".join(item.name for item in short)
    if plan.goal == "answers":
        return f"In short: ${plan.remaining_usd:,.2f} buys {tokens}; {cut} stop short and fail till it rises."
    return (
        f"In short: ${plan.remaining_usd:,.2f} buys {tokens} (budget.policy in_order); {cut} stop short and "
        f"fail, so no {plan.goal} until budget.usd is raised, or set budget.policy: share."
    )


def _then(plan: SpendPlan) -> str:
    """What the command builds after the answers, by its targets."""
    names = ", ".join(item.name for item in plan.sets)
    return {
        "drafter": "then a drafter trained on them",
        "hidden states": f"then the hidden states of {names}",
        "token ids": f"then the token ids of {names}",
        "answers": f"then the answers of {names}",
    }[plan.goal]


def _sets(count: int) -> str:
    return f"{count} set" if count == 1 else f"{count} sets"


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    if seconds < 48 * 3600:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} days"


def _params(count: int | None) -> str:
    if count is None:
        return UNKNOWN
    return f"{count / 1e9:.1f}B" if count >= 1e9 else f"{count / 1e6:.0f}M"


def _millions(count: int | None) -> str:
    if count is None:
        return UNKNOWN
    return f"{count / 1e6:,.1f}M" if count >= 1e6 else f"{count:,}"


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
