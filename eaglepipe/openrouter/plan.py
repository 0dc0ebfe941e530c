"""The spend plan: what the sets still to generate will cost and what their hidden states will take on disk.

Printed at parse time, so `snakemake -n` shows it and a real run shows the same plan before it spends.
It reads only local files of one results root (prompt sets, journal tallies, the ledger, providers.json)
and the target's config and tokenizer: no request, no key. Every estimate it cannot make says "unknown"
rather than guess.
"""

from __future__ import annotations

import json
import os
import struct
import sys
from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from eaglepipe.config import is_local_api
from eaglepipe.hidden.storage import BYTES_PER_VALUE, STORED_LAYERS, bytes_per_token, capped_tokens
from eaglepipe.io import read_jsonl
from eaglepipe.layout import RunLayout
from eaglepipe.openrouter.budget import MIN_OBSERVATIONS
from eaglepipe.openrouter.journal import tally_done
from eaglepipe.openrouter.ledger import read_ledger
from eaglepipe.openrouter.routing import dearest_price
from eaglepipe.target.architecture import TargetArchitecture, TargetConfigError

if TYPE_CHECKING:
    from eaglepipe.target.chat_format import ChatFormat

# Bytes of a prompt's JSON (messages and tools, structure included) per input token, used when the
# target's tokenizer is not at hand. It errs high on tokens: the demo's SmolLM2 prompts measure 3.4, and
# a larger vocabulary (Kimi-K2.5's 163k) packs more bytes into a token.
BYTES_PER_TOKEN = 3.5
HEADER = "eaglepipe spend plan (no request sent, no key read; the same plan prints before a real run spends)"
EMULATED = (
    "This is the emulator's plan (api.base_url: local): its providers and dollars are simulated and nothing "
    "is bought; 'unknown' only means the demo's prompt sets are not built yet."
)
UNKNOWN = "unknown"


@dataclass(frozen=True)
class Prices:
    """USD per token of the dearest kept endpoint, each side separately, so the plan is an upper bound."""

    prompt: float
    completion: float
    source: str

    def cost(self, input_tokens: int, output_tokens: int) -> float:
        return input_tokens * self.prompt + output_tokens * self.completion


@dataclass(frozen=True)
class SetPlan:
    """One prompt set. `status`: generate (no responses yet), extract (no hidden states yet) or done.
    None means unknown; `coverage` is filled in run-wide, in config order."""

    name: str
    status: str
    prompts: int | None = None
    left: int | None = None
    input_tokens: int | None = None
    per_answer: int | None = None
    per_answer_source: str = ""
    output_tokens: int | None = None
    capped: bool = False
    usd: float | None = None
    # True when the input tokens are unknown (prompts not built yet): `usd` then covers the outputs only.
    usd_at_least: bool = False
    coverage: str = "-"
    disk_bytes: int | None = None
    disk_at_least: bool = False  # input tokens unknown: the outputs' share only


@dataclass(frozen=True)
class SpendPlan:
    results: Path
    sets: list[SetPlan]
    prices: Prices | None
    input_method: str | None
    max_tokens: int
    target_dir: Path
    spent_usd: float
    budget_usd: float
    hidden_size: int | None
    dtype: str
    hidden_caps: str = ""  # "1,250 samples (hidden.max_samples)": what bounds each set's shards
    # Presentation: where hidden_size came from, and whether the API is the local emulator.
    hidden_size_source: str = "the target's config.json"
    emulated: bool = False

    @property
    def remaining_usd(self) -> float:
        return max(self.budget_usd - self.spent_usd, 0.0)

    @property
    def has_work(self) -> bool:
        return any(item.status != "done" for item in self.sets)


class InputTokens:
    """Counts a prompt's input tokens: through the chat template of the target's tokenizer when it has a
    tokenizer.json (a fast tokenizer: no remote code, no torch), else from its bytes. The tokenizer loads on
    first use only."""

    def __init__(self, target_dir: Path) -> None:
        self.target_dir = target_dir
        self.method: str | None = None
        self._format: ChatFormat | None = None

    def __call__(self, prompt: dict[str, Any]) -> int:
        if self.method is None:
            self._format = _template_format(self.target_dir)
            self.method = "tokenizer" if self._format else "bytes"
        if self._format is None:
            return round(prompt_json_bytes(prompt) / BYTES_PER_TOKEN)
        messages, tools = prompt["messages"], prompt.get("tools")
        return len(self._format.prompt_ids(messages, tools, thinking=False, tool_format="json"))


def spend_plan(
    config: dict[str, Any],
    datasets: list[str],
    fingerprint: str,
    *,
    layout: RunLayout,
) -> SpendPlan:
    """The plan for `datasets` (in config order) from a validated config and the files of one results
    root: its per-set folders, providers.json and ledger, nothing outside it."""
    target_dir = Path(config["target"]["path"])
    prices = dearest_prices(layout.providers, config["api"]["model"]) or configured_prices(config)
    hidden_size, hidden_size_source = target_hidden_size(target_dir), "the target's config.json"
    if hidden_size is None and config["target"].get("hidden_size"):
        # Before the target is downloaded, the width the config states sizes the shards.
        hidden_size, hidden_size_source = config["target"]["hidden_size"], "target.hidden_size"
    bytes_per_token = shard_bytes_per_token(hidden_size, config["hidden"]["dtype"])
    count_input = InputTokens(target_dir)
    sets = [
        _plan_set(config, ds, layout, fingerprint, prices, count_input, bytes_per_token)
        for ds in datasets
    ]
    spent = read_ledger(layout.ledger).usd
    budget = float(config["budget"]["usd"])
    return SpendPlan(
        results=layout.results,
        sets=with_coverage(sets, max(budget - spent, 0.0)),
        prices=prices,
        input_method=count_input.method,
        max_tokens=config["generation"]["max_tokens"],
        target_dir=target_dir,
        spent_usd=spent,
        budget_usd=budget,
        hidden_size=hidden_size,
        hidden_size_source=hidden_size_source,
        dtype=config["hidden"]["dtype"],
        hidden_caps=_caps(config["hidden"]),
        emulated=is_local_api(config),
    )


def dearest_prices(providers_path: Path, model: str) -> Prices | None:
    """Prices from the cached endpoint list; None without one, or when it lists another model's endpoints."""
    try:
        providers = json.loads(Path(providers_path).read_text())
    except (OSError, ValueError):
        return None
    kept = providers.get("kept") or []
    if providers.get("model") != model or not kept:
        return None
    return Prices(
        prompt=dearest_price(kept, "prompt"),
        completion=dearest_price(kept, "completion"),
        source=f"dearest kept endpoint in {providers_path}",
    )


def configured_prices(config: dict[str, Any]) -> Prices | None:
    """`budget.price_per_m_tokens`, for planning before providers.json was ever fetched."""
    price = config["budget"].get("price_per_m_tokens")
    if not price:
        return None
    return Prices(
        prompt=price["input"] / 1e6, completion=price["output"] / 1e6, source="budget.price_per_m_tokens"
    )


def target_hidden_size(target_dir: Path) -> int | None:
    """From the target's config.json, once it is there (`architecture.TargetArchitecture`)."""
    try:
        return TargetArchitecture.from_dir(target_dir).hidden_size
    except TargetConfigError:
        return None


def shard_bytes_per_token(hidden_size: int | None, dtype: str) -> int | None:
    """What one token costs in the shards (states, fp8 scales, id and mask)."""
    return None if hidden_size is None else bytes_per_token(hidden_size, dtype)


def with_coverage(sets: list[SetPlan], remaining_usd: float) -> list[SetPlan]:
    """How far the remaining dollars reach, spent in config order: full, partly or no; unknown from the
    first set whose cost is unknown on, since it may take any share of the rest."""
    out, cumulative, priced = [], 0.0, True
    for item in sets:
        if item.status != "generate":
            out.append(item)
            continue
        priced = priced and item.usd is not None
        if not priced:
            out.append(replace(item, coverage=UNKNOWN))
            continue
        before, cumulative = cumulative, cumulative + item.usd
        coverage = "full" if cumulative <= remaining_usd else "partly" if before < remaining_usd else "no"
        out.append(replace(item, coverage=coverage))
    return out


def sets_named_by(targets: Iterable[str], datasets: list[str], layout: RunLayout) -> list[str]:
    """The sets whose files the targets are (a prompt file buys nothing); every set when no target is
    given or one is not a single set's file (a rule name, the drafter), since those need every set."""
    targets = list(targets)
    if not targets:
        return list(datasets)
    named = set()
    for target in targets:
        kind, ds = _set_file(target, datasets, layout)
        if kind == "set":
            named.add(ds)
        elif kind != "prompts":
            return list(datasets)
    return [ds for ds in datasets if ds in named]


def _set_file(path: str, datasets: list[str], layout: RunLayout) -> tuple[str | None, str]:
    """("set", ds) for a file in a set's folder, ("prompts", ds) for a built prompt set, else (None, "")."""
    parts, root, prompts = _parts(path), _parts(layout.results), _parts(layout.prompts)
    below_root = parts[len(root):] if parts[: len(root)] == root else ()
    below_prompts = parts[len(prompts):] if parts[: len(prompts)] == prompts else ()
    if len(below_root) >= 2 and below_root[0] in datasets:
        return "set", below_root[0]
    if len(below_prompts) == 1 and below_prompts[0].endswith(".jsonl"):
        return "prompts", below_prompts[0].removesuffix(".jsonl")
    return None, ""


def _parts(path: str | Path) -> tuple[str, ...]:
    return Path(os.path.normpath(path)).parts


def command_line_targets(argv: list[str]) -> list[str]:
    """The targets of a `snakemake` command line, parsed by Snakemake's own parser (at parse time the
    workflow does not know them yet); none when this process was not started as `snakemake`. Building
    that parser costs most of a second, so callers first check that a word could be a target at all."""
    program = Path(argv[0]) if argv else Path()
    if "snakemake" not in (program.name, program.parent.name):
        return []
    from snakemake.cli import get_argument_parser

    args, _unknown = get_argument_parser().parse_known_args(argv[1:])
    return list(args.targets or [])


def print_spend_plan(
    config: dict[str, Any],
    datasets: list[str],
    fingerprint: str,
    *,
    argv: list[str],
    layout: RunLayout,
    stream: TextIO = sys.stderr,
) -> None:
    """The parse-time hook: the plan for the sets the command line targets. Advisory, so a failure to
    plan is reported in one line and never stops the workflow."""
    try:
        could_narrow = any(_set_file(word, datasets, layout)[0] for word in argv[1:])
        targets = command_line_targets(argv) if could_narrow else []
        scope = sets_named_by(targets, datasets, layout)
        plan = spend_plan(config, scope, fingerprint, layout=layout)
    except Exception as error:  # whatever breaks an estimate must not block the run
        print(f"eaglepipe: no spend plan ({type(error).__name__}: {error})", file=stream)
        return
    print(format_plan(plan), file=stream)


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


def _plan_set(
    config: dict[str, Any],
    ds: str,
    layout: RunLayout,
    fingerprint: str,
    prices: Prices | None,
    count_input: InputTokens,
    bytes_per_token: int | None,
) -> SetPlan:
    max_tokens = config["generation"]["max_tokens"]
    if layout.responses(ds).is_file():
        if layout.hidden_done(ds).is_file():
            return SetPlan(ds, "done")
        tokens, samples = _generated_tokens(layout, ds, max_tokens)
        return SetPlan(ds, "extract", disk_bytes=_shard_disk(config, tokens, samples, bytes_per_token))

    done = tally_done(layout.journal(ds), fingerprint)
    prompts_path = layout.prompt_set(ds)
    if prompts_path.is_file():
        prompts = read_jsonl(prompts_path)
        done = {prompt["id"]: done[prompt["id"]] for prompt in prompts if prompt["id"] in done}
        todo = [prompt for prompt in prompts if prompt["id"] not in done]
        total, left, input_tokens = len(prompts), len(todo), sum(map(count_input, todo))
    else:  # not built yet: the source's sample is the best count there is
        total = config["sources"][ds].get("sample")
        left = None if total is None else max(total - len(done), 0)
        input_tokens = None

    configured = config["generation"]["expected_completion_tokens"]
    per_answer, source = per_answer_estimate(done.values(), configured, max_tokens)
    used = sum(_completion_tokens(record, max_tokens) for record in done.values())
    token_budget_left = max(config["budget"]["output_tokens_per_dataset"] - used, 0)
    uncapped = None if left is None else left * per_answer
    output_tokens = None if uncapped is None else min(uncapped, token_budget_left)
    if input_tokens is not None and uncapped:
        # The token budget stops the set early: only the prompts answered before then are billed.
        input_tokens = round(input_tokens * output_tokens / uncapped)
    usd = None
    if prices is not None and output_tokens is not None:
        usd = prices.cost(input_tokens or 0, output_tokens)
    disk = None
    if output_tokens is not None:
        # Without the prompts built, their input tokens are unknown: the outputs' share is a floor.
        known = sum(_record_tokens(record, max_tokens) for record in done.values())
        # The output-token cap stops a set early: only the answered prompts get hidden states.
        answered = len(done) + (round(output_tokens / per_answer) if per_answer else 0)
        disk = _shard_disk(config, known + (input_tokens or 0) + output_tokens, answered, bytes_per_token)
    return SetPlan(
        name=ds,
        status="generate",
        prompts=total,
        left=left,
        input_tokens=input_tokens,
        per_answer=per_answer,
        per_answer_source=source,
        output_tokens=output_tokens,
        capped=uncapped is not None and output_tokens < uncapped,
        usd=usd,
        usd_at_least=usd is not None and input_tokens is None,
        disk_bytes=disk,
        disk_at_least=disk is not None and input_tokens is None,
    )


def per_answer_estimate(
    records: Iterable[dict[str, Any]], configured: int, max_tokens: int
) -> tuple[int, str]:
    """(completion tokens per answer, where from): the journal's mean once it is a fair sample (as the
    client's own estimate), else the configured guess; never above max_tokens."""
    counts = [_completion_tokens(record, max_tokens) for record in records]
    if len(counts) >= MIN_OBSERVATIONS:
        return min(round(sum(counts) / len(counts)), max_tokens), "journal"
    return min(configured, max_tokens), "config"


def _completion_tokens(record: dict[str, Any], max_tokens: int) -> int:
    """Unknown usage counts as max_tokens, as the client counts it against the token budget."""
    tokens = (record.get("usage") or {}).get("completion_tokens")
    return max_tokens if tokens is None else int(tokens)


def _record_tokens(record: dict[str, Any], max_tokens: int) -> int:
    return int((record.get("usage") or {}).get("prompt_tokens") or 0) + _completion_tokens(record, max_tokens)


def _generated_tokens(layout: RunLayout, ds: str, max_tokens: int) -> tuple[int, int]:
    """(tokens, samples) a finished set feeds the hidden stage: exact from the token file's header once
    it exists (cheap), else billed prompt plus completion tokens from responses.jsonl."""
    tokens_path = layout.tokens(ds)
    if tokens_path.is_file():
        with open(tokens_path, "rb") as handle:
            (header_len,) = struct.unpack("<Q", handle.read(8))
            header = json.loads(handle.read(header_len))
        return int(header["input_ids"]["shape"][0]), int(header["offsets"]["shape"][0]) - 1
    records = read_jsonl(layout.responses(ds))
    return sum(_record_tokens(record, max_tokens) for record in records), len(records)


def _caps(hidden: dict[str, Any]) -> str:
    caps = []
    if hidden["max_samples"] is not None:
        caps.append(f"{hidden['max_samples']:,} samples (hidden.max_samples)")
    if hidden["max_tokens"] is not None:
        caps.append(f"{hidden['max_tokens']:,} tokens (hidden.max_tokens)")
    return " and ".join(caps)


def _shard_disk(
    config: dict[str, Any], tokens: int | None, samples: int | None, bytes_per_token: int | None
) -> int | None:
    """The shards' bytes under hidden.max_samples / hidden.max_tokens (samples of average length)."""
    if tokens is None or bytes_per_token is None:
        return None
    hidden = config["hidden"]
    caps = {"max_samples": hidden["max_samples"], "max_tokens": hidden["max_tokens"]}
    return capped_tokens(tokens, samples, **caps) * bytes_per_token


def prompt_json_bytes(prompt: dict[str, Any]) -> int:
    """The prompt's size as sent (its messages and tools as compact JSON), where no tokenizer counts it."""
    body = {"messages": prompt["messages"], "tools": prompt.get("tools")}
    return len(json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode("utf-8"))


def _template_format(target_dir: Path) -> ChatFormat | None:
    """The chat template of the target's fast tokenizer, or None where it has none or it does not load
    (then bytes count). A template cannot reason and declares tools its own way, so the counts pass any
    `thinking` and `tool_format`."""
    if not (target_dir / "tokenizer.json").is_file():
        return None
    try:
        from transformers import PreTrainedTokenizerFast

        from eaglepipe.target.hf_tokenizer import HFTokenizer

        return HFTokenizer(PreTrainedTokenizerFast.from_pretrained(str(target_dir))).chat_format()
    except Exception:  # any failure only means the cruder estimate is used
        return None


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
    if item.usd is None or plan.prices is None or item.left is None:
        return item.usd, None
    most = item.output_tokens if item.capped else item.left * plan.max_tokens
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
    buying = [item for item in plan.sets if item.status == "generate"]
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


def _size(value: int | None) -> str:
    if value is None:
        return UNKNOWN
    for unit in ("B", "kB", "MB", "GB"):
        if value < 1000:
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1000
    return f"{value:,.1f} TB"
