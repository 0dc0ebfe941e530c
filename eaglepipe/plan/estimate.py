"""The plan's estimates from the files of one results root and the target's config and tokenizer: no
request, no key. Every figure it cannot make is None ("unknown") rather than a guess."""

from __future__ import annotations

import struct
from collections.abc import Iterable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from eaglepipe.config import answer_source, is_local_api, sets_answered_by
from eaglepipe.config_types import Config, HfSource, HiddenSection, JsonlSource, Source, TargetSection
from eaglepipe.hidden.storage import bytes_per_token, capped_tokens
from eaglepipe.layout import RunLayout
from eaglepipe.openrouter.budget import MIN_OBSERVATIONS
from eaglepipe.openrouter.connection import read_providers
from eaglepipe.openrouter.dollars import buys_more_on_rerun, planned_budget
from eaglepipe.openrouter.fingerprint import engine_fingerprint
from eaglepipe.openrouter.journal import tally_done
from eaglepipe.openrouter.ledger import read_ledger
from eaglepipe.openrouter.routing import dearest_price
from eaglepipe.plan.hours import plan_hours
from eaglepipe.plan.model import UNKNOWN, Prices, SetPlan, SpendPlan
from eaglepipe.prompts.records import PromptRecord, read_prompt_set
from eaglepipe.prompts.size import prompt_json_bytes
from eaglepipe.responses import read_responses
from eaglepipe.target.architecture import TargetArchitecture, TargetConfigError, published_config_dir
from eaglepipe.tokens.token_file import read_token_stats, token_file_counts

if TYPE_CHECKING:
    from eaglepipe.target.chat_format import ChatFormat

# Bytes of a prompt's JSON (messages and tools, structure included) per input token, used when the
# target's tokenizer is not at hand. It errs high on tokens: the demo's SmolLM2 prompts measure 3.4, and
# a larger vocabulary (Kimi-K2.5's 163k) packs more bytes into a token.
BYTES_PER_TOKEN = 3.5


class InputTokens:
    """Counts a prompt's input tokens: through the chat template of the target's tokenizer when it has a
    tokenizer.json (a fast tokenizer: no remote code, no torch), else from its bytes. The tokenizer loads on
    first use only."""

    def __init__(self, target_dir: Path) -> None:
        self.target_dir = target_dir
        self.method: str | None = None
        self._format: ChatFormat | None = None

    def __call__(self, prompt: PromptRecord) -> int:
        if self.method is None:
            self._format = _template_format(self.target_dir)
            self.method = "tokenizer" if self._format else "bytes"
        if self._format is None:
            return round(prompt_json_bytes(prompt) / BYTES_PER_TOKEN)
        messages, tools = prompt["messages"], prompt.get("tools")
        return len(self._format.prompt_ids(messages, tools, thinking=False, tool_format="json"))


def spend_plan(
    config: Config,
    datasets: list[str],
    fingerprint: str,
    *,
    layout: RunLayout,
    goal: str = "drafter",
) -> SpendPlan:
    """The plan for `datasets` (in config order) from a validated config and the files of one results
    root: its per-set folders, providers.json and ledger, nothing outside it. `goal`: what the command
    builds of them (SpendPlan.goal)."""
    target_dir = Path(config["target"]["path"])
    prices = dearest_prices(layout.providers, config["api"]["model"]) or configured_prices(config)
    architecture, geometry_source = target_geometry(config["target"])
    hidden_size = None if architecture is None else architecture.hidden_size
    hidden_size_source = geometry_source
    if hidden_size is None and config["target"].get("hidden_size"):
        # Before the target is downloaded, the width the config states sizes the shards.
        hidden_size, hidden_size_source = config["target"]["hidden_size"], "target.hidden_size"
    bytes_per_token = shard_bytes_per_token(hidden_size, config["hidden"]["dtype"])
    count_input = InputTokens(target_dir)
    bought_sets = sets_answered_by(config, Source.OPENROUTER, config["datasets"])
    sets = [_plan_set(config, ds, layout, fingerprint, prices, count_input, bought_sets) for ds in datasets]
    ledger = read_ledger(layout.ledger)
    spent = ledger.usd
    budget = float(config["budget"]["usd"])
    dollars = planned_budget(config, bought_sets)
    if dollars.set_usd is None:
        covered = with_coverage(sets, max(budget - spent, 0.0))
    else:
        covered = with_shares(sets, dollars.set_usd, ledger.usd_by_set)
    covered = [_with_hidden_tokens(item, config["hidden"], bytes_per_token) for item in covered]
    hidden_tokens = _sum_known(item.hidden_tokens for item in covered if item.status != "done")
    train_tokens = _sum_known(item.hidden_tokens for item in covered)
    bought_output = [item for item in covered if item.to_buy]
    output_tokens = _sum_known(item.bought_output_tokens for item in bought_output)
    measured_yield, yield_sets = training_yield(layout, config["datasets"])
    return SpendPlan(
        results=layout.results,
        sets=covered,
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
        policy=dollars.policy,
        share_usd=dollars.set_usd,
        goal=goal,
        hours=plan_hours(
            config,
            architecture,
            geometry_source,
            checkpoint_bytes(target_dir),
            output_tokens,
            hidden_tokens,
            train_tokens,
        ),
        measured_yield=measured_yield,
        yield_sets=yield_sets,
    )


def training_yield(layout: RunLayout, datasets: list[str]) -> tuple[float | None, int]:
    """(share of bought output tokens trained on, sets it was measured on) over every tokenized set of
    this results root (`tokens.json` `yield`); (None, 0) before any."""
    bought = trained = sets = 0
    for ds in datasets:
        path = layout.token_stats(ds)
        try:
            measured = read_token_stats(path).get("yield") if path.is_file() else None
        except (OSError, ValueError):  # a file being written, or not tokens.json at all
            measured = None
        if measured and measured.get("bought_tokens"):
            bought += measured["bought_tokens"]
            trained += measured["trained_tokens"]
            sets += 1
    return (trained / bought if bought else None), sets


def dearest_prices(providers_path: Path, model: str) -> Prices | None:
    """Prices from the cached endpoint list; None without one, or when it lists another model's endpoints."""
    try:
        providers = read_providers(Path(providers_path))
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


def configured_prices(config: Config) -> Prices | None:
    """`budget.price_per_m_tokens`, for planning before providers.json was ever fetched."""
    price = config["budget"].get("price_per_m_tokens")
    if not price:
        return None
    return Prices(
        prompt=price["input"] / 1e6, completion=price["output"] / 1e6, source="budget.price_per_m_tokens"
    )


def target_hidden_size(target_dir: Path) -> int | None:
    """From the target's config.json, once it is there (`architecture.TargetArchitecture`)."""
    architecture = target_architecture(target_dir)
    return None if architecture is None else architecture.hidden_size


def target_geometry(target: TargetSection) -> tuple[TargetArchitecture | None, str]:
    """The target's shapes and where they come from: its own config.json once it is at `target.path`,
    before that the published copy the package keeps for `target.name`; (None, "") without either."""
    own = target_architecture(Path(target["path"]))
    if own is not None:
        return own, "the target's config.json"
    published = target_architecture(published_config_dir(target["name"]))
    if published is None:
        return None, ""
    return published, f"{target['name']}'s published config.json, until {target['path']} has its own"


def checkpoint_bytes(target_dir: Path) -> int | None:
    """The target's weights on disk (its safetensors files), or None before they are there."""
    files = list(target_dir.glob("*.safetensors")) if target_dir.is_dir() else []
    return sum(path.stat().st_size for path in files) if files else None


def target_architecture(target_dir: Path) -> TargetArchitecture | None:
    try:
        architecture = TargetArchitecture.from_dir(target_dir)
        architecture.hidden_size  # noqa: B018  (a config.json without it is no target's yet)
    except TargetConfigError:
        return None
    return architecture


def shard_bytes_per_token(hidden_size: int | None, dtype: str) -> int | None:
    """What one token costs in the shards (states, fp8 scales, id and mask)."""
    return None if hidden_size is None else bytes_per_token(hidden_size, dtype)


def with_coverage(sets: list[SetPlan], remaining_usd: float) -> list[SetPlan]:
    """budget.policy in_order: how far the remaining dollars reach, spent in config order: full, partly or
    no; unknown from the first set whose cost is unknown on, since it may take any share of the rest."""
    out, cumulative, priced = [], 0.0, True
    for item in sets:
        if item.status != "generate":
            out.append(item)
            continue
        if not item.bought:
            out.append(_unbought(item))
            continue
        if not priced or item.usd is None:
            priced = False
            out.append(replace(item, coverage=UNKNOWN))
            continue
        before, cumulative = cumulative, cumulative + item.usd
        reach = min(max(remaining_usd - before, 0.0), item.usd)
        out.append(_covered(item, reach))
    return out


def _unbought(item: SetPlan) -> SetPlan:
    """A set the team's engine or an import answers: it costs nothing, and all of it reaches training."""
    return replace(item, coverage=item.source.value, bought_output_tokens=item.output_tokens)


def with_shares(sets: list[SetPlan], share_usd: float, spent_by_set: dict[str, float]) -> list[SetPlan]:
    """budget.policy share: each bought set reaches as far as its part of budget.usd, less what it spent."""
    out = []
    for item in sets:
        if item.status != "generate":
            out.append(item)
        elif not item.bought:
            out.append(_unbought(item))
        elif item.usd is None:
            out.append(replace(item, coverage=UNKNOWN))
        else:
            reach = min(max(share_usd - spent_by_set.get(item.name, 0.0), 0.0), item.usd)
            out.append(_covered(item, reach))
    return out


def _covered(item: SetPlan, reach_usd: float) -> SetPlan:
    """The set with `reach_usd` of its dollars spent: what share of its answers that buys."""
    fraction = 1.0 if not item.usd else reach_usd / item.usd
    coverage = "full" if fraction >= 1.0 else "partly" if fraction > 0 else "no"
    bought = None if item.output_tokens is None else round(item.output_tokens * fraction)
    todo_tokens = None if item.todo_tokens is None else round(item.todo_tokens * fraction)
    todo_samples = None if item.todo_samples is None else round(item.todo_samples * fraction)
    return replace(
        item,
        coverage=coverage,
        bought_output_tokens=bought,
        todo_tokens=todo_tokens,
        todo_samples=todo_samples,
    )


def _with_hidden_tokens(item: SetPlan, hidden: HiddenSection, bytes_per_token: int | None) -> SetPlan:
    """The tokens (and shard bytes) its hidden states will hold, at what is bought, under the caps."""
    if item.status == "done" or item.todo_tokens is None or item.todo_samples is None:
        return item
    tokens = capped_tokens(
        item.done_tokens + item.todo_tokens,
        item.done_samples + item.todo_samples,
        max_samples=hidden["max_samples"],
        max_tokens=hidden["max_tokens"],
    )
    disk = None if bytes_per_token is None else tokens * bytes_per_token
    return replace(item, hidden_tokens=tokens, disk_bytes=disk)


def _sum_known(values: Iterable[int | None]) -> int | None:
    values = list(values)
    return None if any(value is None for value in values) else sum(v for v in values if v is not None)


def _plan_set(
    config: Config,
    ds: str,
    layout: RunLayout,
    fingerprint: str,
    prices: Prices | None,
    count_input: InputTokens,
    bought_sets: list[str],
) -> SetPlan:
    max_tokens = config["generation"]["max_tokens"]
    summary, responses = layout.responses_summary(ds), layout.responses(ds)
    if responses.is_file() and not buys_more_on_rerun(config, bought_sets, summary, responses):
        if layout.hidden_done(ds).is_file():  # its tokens still count for training
            return SetPlan(ds, "done", hidden_tokens=_trained_tokens(config, layout, ds))
        tokens, samples = _generated_tokens(layout, ds, max_tokens)
        return SetPlan(ds, "extract", todo_tokens=tokens, todo_samples=samples)

    answered_by = answer_source(config, ds)
    journaled_as = engine_fingerprint(config) if answered_by is Source.ENGINE else fingerprint
    done = tally_done(layout.journal(ds), journaled_as)
    prompts_path = layout.prompt_set(ds)
    total: int | None
    left: int | None
    input_tokens: int | None
    if prompts_path.is_file():
        prompts = read_prompt_set(prompts_path)
        done = {prompt["id"]: done[prompt["id"]] for prompt in prompts if prompt["id"] in done}
        todo = [prompt for prompt in prompts if prompt["id"] not in done]
        total, left, input_tokens = len(prompts), len(todo), sum(map(count_input, todo))
    else:  # not built yet: the source's sample, or a local file's lines, is the best count there is
        total = _source_size(config["sources"][ds])
        left = None if total is None else max(total - len(done), 0)
        input_tokens = None

    configured = config["generation"]["expected_completion_tokens"]
    per_answer, source = per_answer_estimate(done.values(), configured, max_tokens)
    used = sum(_completion_tokens(record, max_tokens) for record in done.values())
    token_budget_left = max(config["budget"]["output_tokens_per_dataset"] - used, 0)
    output_tokens: int | None = None
    capped = False
    if left is not None:
        uncapped = left * per_answer
        output_tokens = min(uncapped, token_budget_left)
        capped = output_tokens < uncapped
        if input_tokens is not None and uncapped:
            # The token budget stops the set early: only the prompts answered before then are billed.
            input_tokens = round(input_tokens * output_tokens / uncapped)
    usd = None
    if answered_by is not Source.OPENROUTER:
        usd = 0.0
    elif prices is not None and output_tokens is not None:
        usd = prices.cost(input_tokens or 0, output_tokens)
    # Without the prompts built, their input tokens are unknown: the outputs' share is a floor. The
    # output-token cap stops a set early: only the answered prompts get hidden states.
    todo_tokens = None if output_tokens is None else (input_tokens or 0) + output_tokens
    todo_samples = None if output_tokens is None else (round(output_tokens / per_answer) if per_answer else 0)
    return SetPlan(
        name=ds,
        status="generate",
        prompts=total,
        left=left,
        input_tokens=input_tokens,
        per_answer=per_answer,
        per_answer_source=source,
        output_tokens=output_tokens,
        capped=capped,
        usd=usd,
        usd_at_least=usd is not None and input_tokens is None,
        disk_at_least=input_tokens is None,
        source=answered_by,
        done_tokens=sum(_record_tokens(record, max_tokens) for record in done.values()),
        done_samples=len(done),
        todo_tokens=todo_tokens,
        todo_samples=todo_samples,
    )


def _source_size(source: JsonlSource | HfSource) -> int | None:
    """How many prompts a source will give: a dataset's `sample`, a local file's non-empty lines."""
    if source["type"] == "hf":
        return source.get("sample")
    try:
        with open(source["path"], encoding="utf-8") as handle:
            return sum(1 for line in handle if line.strip())
    except OSError:
        return None


def per_answer_estimate(
    records: Iterable[Mapping[str, Any]], configured: int, max_tokens: int
) -> tuple[int, str]:
    """(completion tokens per answer, where from): the journal's mean once it is a fair sample (as the
    client's own estimate), else the configured guess; never above max_tokens."""
    counts = [_completion_tokens(record, max_tokens) for record in records]
    if len(counts) >= MIN_OBSERVATIONS:
        return min(round(sum(counts) / len(counts)), max_tokens), "journal"
    return min(configured, max_tokens), "config"


def _completion_tokens(record: Mapping[str, Any], max_tokens: int) -> int:
    """Unknown usage counts as max_tokens, as the client counts it against the token budget."""
    tokens = (record.get("usage") or {}).get("completion_tokens")
    return max_tokens if tokens is None else int(tokens)


def _record_tokens(record: Mapping[str, Any], max_tokens: int) -> int:
    return int((record.get("usage") or {}).get("prompt_tokens") or 0) + _completion_tokens(record, max_tokens)


def _generated_tokens(layout: RunLayout, ds: str, max_tokens: int) -> tuple[int, int]:
    """(tokens, samples) a finished set feeds the hidden stage: exact from the token file's header once
    it exists (cheap), else billed prompt plus completion tokens from responses.jsonl."""
    tokens_path = layout.tokens(ds)
    if tokens_path.is_file():
        return token_file_counts(tokens_path)
    records = read_responses(layout.responses(ds))
    return sum(_record_tokens(record, max_tokens) for record in records), len(records)


def _trained_tokens(config: Config, layout: RunLayout, ds: str) -> int | None:
    """A finished set's tokens in its hidden states, for training's hours; unknown where its files cannot
    say (the plan of the other sets must not depend on them)."""
    try:
        tokens, samples = _generated_tokens(layout, ds, config["generation"]["max_tokens"])
    except (OSError, ValueError, KeyError, struct.error):
        return None
    caps = config["hidden"]
    return capped_tokens(tokens, samples, max_samples=caps["max_samples"], max_tokens=caps["max_tokens"])


def _caps(hidden: HiddenSection) -> str:
    caps = []
    if hidden["max_samples"] is not None:
        caps.append(f"{hidden['max_samples']:,} samples (hidden.max_samples)")
    if hidden["max_tokens"] is not None:
        caps.append(f"{hidden['max_tokens']:,} tokens (hidden.max_tokens)")
    return " and ".join(caps)


def _template_format(target_dir: Path) -> ChatFormat | None:
    """The chat template of the target's fast tokenizer, or None where it has none or it does not load
    (then bytes count). A template cannot reason and declares tools its own way, so the counts pass any
    `thinking` and `tool_format`."""
    if not (target_dir / "tokenizer.json").is_file():
        return None
    try:  # imported here, on first use: the plan module loads while Snakemake parses
        from transformers import PreTrainedTokenizerFast

        from eaglepipe.target.chat_format import TemplateChatFormat
        from eaglepipe.target.hf_tokenizer import HFTokenizer

        return TemplateChatFormat(HFTokenizer(PreTrainedTokenizerFast.from_pretrained(str(target_dir))))
    except Exception:  # any failure only means the cruder estimate is used
        return None
