"""The plan's estimates from the files of one results root and the target's config and tokenizer: no
request, no key. Every figure it cannot make is None ("unknown") rather than a guess."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from eaglepipe.config import answer_source, is_local_api
from eaglepipe.hidden.storage import bytes_per_token, capped_tokens
from eaglepipe.io import read_jsonl
from eaglepipe.layout import RunLayout
from eaglepipe.openrouter.budget import MIN_OBSERVATIONS
from eaglepipe.openrouter.fingerprint import engine_fingerprint
from eaglepipe.openrouter.journal import tally_done
from eaglepipe.openrouter.ledger import read_ledger
from eaglepipe.openrouter.routing import dearest_price
from eaglepipe.plan.model import UNKNOWN, Prices, SetPlan, SpendPlan
from eaglepipe.prompts.size import prompt_json_bytes
from eaglepipe.target.architecture import TargetArchitecture, TargetConfigError
from eaglepipe.tokens.token_file import token_file_counts

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
        if item.source != "openrouter":  # answered by the team's engine or imported: costs nothing
            out.append(replace(item, coverage=item.source))
            continue
        if not priced or item.usd is None:
            priced = False
            out.append(replace(item, coverage=UNKNOWN))
            continue
        before, cumulative = cumulative, cumulative + item.usd
        coverage = "full" if cumulative <= remaining_usd else "partly" if before < remaining_usd else "no"
        out.append(replace(item, coverage=coverage))
    return out


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

    answered_by = answer_source(config, ds)
    journaled_as = engine_fingerprint(config) if answered_by == "engine" else fingerprint
    done = tally_done(layout.journal(ds), journaled_as)
    prompts_path = layout.prompt_set(ds)
    total: int | None
    left: int | None
    input_tokens: int | None
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
    if answered_by != "openrouter":
        usd = 0.0
    elif prices is not None and output_tokens is not None:
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
        capped=capped,
        usd=usd,
        usd_at_least=usd is not None and input_tokens is None,
        disk_bytes=disk,
        disk_at_least=disk is not None and input_tokens is None,
        source=answered_by,
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
        return token_file_counts(tokens_path)
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
