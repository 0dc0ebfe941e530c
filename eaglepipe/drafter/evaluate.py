"""Acceptance length in a real draft-and-verify loop against the HF target (greedy, one draft chain).

Every method emits exactly the target's greedy output; they differ only in how many target forwards it
takes. Acceptance length as SGLang reports it: tokens emitted per verify forward (accepted drafts plus
the target's bonus token), so 1.0 means the drafts never helped. The drafter runs with the training
alignment: after the target has verified position t, the drafter consumes (aux[t], token t+1).
"""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NotRequired, Protocol, TypedDict

import torch
from torch import Tensor
from transformers import DynamicCache

from eaglepipe.config import section_fields
from eaglepipe.config_types import EvalSection
from eaglepipe.drafter import DrafterError
from eaglepipe.drafter.export import load_exported
from eaglepipe.drafter.model import DraftCache, Eagle3Drafter
from eaglepipe.target.attention import use_grouped_sdpa
from eaglepipe.target.kv_cache import filled_layers, growing_cache
from eaglepipe.target.load import load_target, load_target_tokenizer

PROMPT_LOOKUP_MAX_NGRAM = 3
ENGINE = "eaglepipe draft-and-verify loop (transformers target, greedy, one draft chain)"


class Acceptance(TypedDict):
    """One method's acceptance over some runs (`_acceptance`): ours, and vLLM's counts beside it."""

    acceptance_length: float | None
    target_forwards: int
    tokens: int
    accepted_drafts: int
    accepted_per_position: list[int]
    acceptance_rate_per_position: list[float | None]


class PromptLabel(TypedDict, total=False):
    """Which prompt a per-prompt entry is (absent when the caller named none)."""

    prompt_id: str
    set: str


class PromptAcceptance(PromptLabel, Acceptance):
    pass


class MethodReport(Acceptance):
    per_prompt: list[PromptAcceptance]


class EvalRunSettings(TypedDict):
    num_steps: int
    topk: int
    num_draft_tokens: int
    max_new_tokens: int
    batch_size: int
    seed: int
    decoding: str
    device: str
    dtype: str


class PromptRef(TypedDict):
    id: str
    set: str


class EvalReport(TypedDict):
    """eval.json (docs/formats.md); the figures read it. `prompts` and `per_set` where the prompts were
    named."""

    methods: dict[str, MethodReport]
    held_out_prompts: int
    outputs_identical_across_methods: bool
    k: int
    engine: str
    seconds: float
    settings: EvalRunSettings
    prompts: NotRequired[list[PromptRef]]
    per_set: NotRequired[dict[str, dict[str, Acceptance]]]


class CurvePoint(Acceptance):
    step: int
    tokens_seen: int


class CurveSettings(TypedDict):
    max_new_tokens: int
    batch_size: int
    seed: int
    dtype: str


class CurveReport(TypedDict):
    """curve.json: acceptance by drafter training kept, beside the untrained drafter and prompt lookup."""

    points: list[CurvePoint]
    prompt_lookup: Acceptance
    held_out_prompts: int
    k: int
    engine: str
    settings: CurveSettings


@dataclass(frozen=True, kw_only=True)
class EvalSettings:
    """How the drafter is measured: the `eval` section of the config, less the held-out prompts' choice
    (training's); schemas/config.schema.yaml holds the defaults."""

    num_steps: int
    topk: int
    num_draft_tokens: int
    max_new_tokens: int
    batch_size: int  # held-out prompts per shared target forward
    device: str
    dtype: str
    seed: int = 0  # the untrained drafter's initialisation; not a config key

    @classmethod
    def from_section(cls, section: EvalSection) -> EvalSettings:
        """From the validated config's `eval` section (its held-out prompts are training's)."""
        return cls(**section_fields(cls, section))


class Proposer(Protocol):
    """Drafts for many sequences at once, each named by a row id that stays the same across calls."""

    @property
    def aux_layer_ids(self) -> list[int] | None:
        """Target layers whose outputs `propose` needs; None: no hidden states."""
        ...

    def propose(
        self, rows: list[int], tokens: list[list[int]], new_aux: list[Tensor | None], num_steps: int
    ) -> list[list[int]]:
        """For each row, up to `num_steps` guesses of the tokens after its `tokens`.

        A row's `new_aux` [n, 3H] holds the aux states of the n positions verified since its last call,
        which are the last n positions before the final token of its `tokens`.
        """
        ...


class EagleProposer:
    """One drafter for all its rows: a cache per row, one packed drafter step for all of them."""

    def __init__(self, drafter: Eagle3Drafter) -> None:
        self.drafter = drafter
        self.aux_layer_ids = list(drafter.config.aux_layer_ids)
        self.caches: dict[int, DraftCache] = {}

    @torch.no_grad()
    def propose(
        self, rows: list[int], tokens: list[list[int]], new_aux: list[Tensor | None], num_steps: int
    ) -> list[list[int]]:
        caches = [self.caches.setdefault(row, DraftCache()) for row in rows]
        states = [aux for aux in new_aux if aux is not None]
        if len(states) != len(new_aux):
            raise DrafterError("the EAGLE proposer drafts from aux states: every row needs them")
        ids = [
            torch.tensor([row_tokens[cache.length + 1 : cache.length + 1 + len(aux)]], device=aux.device)
            for row_tokens, cache, aux in zip(tokens, caches, states, strict=True)
        ]
        hidden = self.drafter.step_packed(ids, [aux[None] for aux in states], caches)
        hidden = [h[:, -1:] for h in hidden]
        drafts: list[list[int]] = [[] for _ in rows]
        for step in range(num_steps):
            guesses = self.drafter.draft_to_target(self.drafter.logits(torch.cat(hidden, dim=1)).argmax(-1))
            for row_drafts, guess in zip(drafts, guesses[0].tolist(), strict=True):
                row_drafts.append(guess)
            if step + 1 < num_steps:
                hidden = self.drafter.step_packed(list(guesses.split(1, dim=1)), hidden, caches)
        return drafts


class PromptLookupProposer:
    """Copy what followed the most recent earlier occurrence of the last n tokens (n = 3, then 2, 1)."""

    aux_layer_ids = None

    def propose(
        self, rows: list[int], tokens: list[list[int]], new_aux: list[Tensor | None], num_steps: int
    ) -> list[list[int]]:
        return [self._lookup(row_tokens, num_steps) for row_tokens in tokens]

    @staticmethod
    def _lookup(tokens: list[int], num_steps: int) -> list[int]:
        for n in range(PROMPT_LOOKUP_MAX_NGRAM, 0, -1):
            suffix = tokens[-n:]
            for start in range(len(tokens) - n - 1, -1, -1):
                if tokens[start : start + n] == suffix:
                    return tokens[start + n : start + n + num_steps]
        return []


@dataclass
class Generation:
    tokens: list[int]  # generated ids, the stop token included when reached
    target_forwards: int  # verify forwards; the prefill is not counted
    # Per draft position i: verify forwards that accepted the draft at i (and so every draft before it).
    # Drafts cut afterwards by the stop token or max_new_tokens count, as in vLLM's metrics.
    accepted_per_position: list[int]

    @property
    def verified_tokens(self) -> int:
        """Tokens the verify forwards emitted: all but the first, which the prefill produced."""
        return max(len(self.tokens) - 1, 0)

    @property
    def accepted_drafts(self) -> int:
        return sum(self.accepted_per_position)


@dataclass
class Prefill:
    """One prompt through the target alone, unpadded: every method's row for that prompt starts from it."""

    keys: list[Tensor]  # per target layer [1, kv_heads, len, head_dim]
    values: list[Tensor]
    first_token: int  # the target's greedy token after the prompt
    aux: Tensor | None  # [len, 3H], the aux states of the prompt's positions


@torch.no_grad()
def prefill(target: Any, prompt: list[int], aux_layer_ids: list[int] | None) -> Prefill:
    cache = DynamicCache()
    out = target(
        input_ids=torch.tensor([prompt], device=target.device),
        cache=cache,
        use_cache=True,
        output_hidden_states=aux_layer_ids is not None,
        logits_to_keep=1,  # only the last position's logits are read: no vocabulary projection for the rest
    )
    aux = None
    if aux_layer_ids is not None:
        aux = torch.cat([out.hidden_states[i + 1][0] for i in aux_layer_ids], dim=-1)
    keys, values = filled_layers(cache)
    return Prefill(
        keys,
        values,
        int(out.logits[0, -1].argmax()),
        aux,
    )


class SharedTargetCache:
    """One KV cache for a batch of rows that accept different numbers of drafts.

    It starts from each row's own prefill, right-padded to the longest. Every forward appends the same
    number of slots to every row; the slots a row does not keep (padding, rejected drafts) stay in the
    cache but are masked out of every later forward, so each row attends to exactly the tokens it would
    have in a cache of its own.
    """

    def __init__(
        self, target: Any, aux_layer_ids: list[int] | None, prefills: list[Prefill], room: int
    ) -> None:
        self.target = target
        self.aux_layer_ids = aux_layer_ids
        lengths = [p.keys[0].shape[2] for p in prefills]
        layers = range(len(prefills[0].keys))
        self.cache = growing_cache(
            [[p.keys[layer] for p in prefills] for layer in layers],
            [[p.values[layer] for p in prefills] for layer in layers],
            room,
        )
        slots = torch.arange(max(lengths), device=target.device)
        self.kept = slots[None, :] < torch.tensor(lengths, device=target.device)[:, None]  # [rows, slots]

    def forward(self, rows: list[list[int]], positions: list[int]) -> tuple[Tensor, Tensor | None]:
        """(logits [B, W, V], aux [B, W, 3H] or None) for each row's ids, right-padded to width W.

        `positions[b]` is the position of row b's first id. Every new slot is kept until `keep` says how
        many of them its row keeps.
        """
        device = self.target.device
        width = max(len(ids) for ids in rows)
        ids = torch.tensor([ids + [0] * (width - len(ids)) for ids in rows], device=device)
        position_ids = torch.tensor(positions, device=device)[:, None] + torch.arange(width, device=device)
        past = self.kept.shape[1]
        fresh = torch.ones(ids.shape, dtype=torch.bool, device=device)
        self.kept = torch.cat((self.kept, fresh), dim=1)
        query_slots = torch.arange(past, past + width, device=device)
        causal = torch.arange(past + width, device=device)[None, :] <= query_slots[:, None]
        out = self.target(
            input_ids=ids,
            attention_mask=(causal[None] & self.kept[:, None, :])[:, None],  # [B, 1, W, slots]
            position_ids=position_ids,
            cache=self.cache,
            use_cache=True,
            output_hidden_states=self.aux_layer_ids is not None,
        )
        if self.aux_layer_ids is None:
            return out.logits, None
        return out.logits, torch.cat([out.hidden_states[i + 1] for i in self.aux_layer_ids], dim=-1)

    def keep(self, slot: int, width: int, kept: int) -> None:
        """The row at `slot` (its place in the cache) keeps the first `kept` of the `width` slots the last
        forward appended."""
        self.kept[slot, self.kept.shape[1] - width + kept :] = False

    def select(self, rows: list[int]) -> None:
        """Only `rows` (in that order) go on: the others have finished and leave every later forward."""
        index = torch.tensor(rows, dtype=torch.long, device=self.kept.device)
        self.cache.batch_select_indices(index)
        self.kept = self.kept[index]


@torch.no_grad()
def speculative_generate(
    target: Any,
    prompt_ids: list[int],
    proposer: Proposer,
    *,
    num_steps: int,
    max_new_tokens: int,
    stop_id: int,
) -> Generation:
    """Greedy decoding of `target`, verifying the proposer's drafts in one forward per round."""
    return speculative_generate_batch(
        target, [prompt_ids], [proposer], num_steps=num_steps, max_new_tokens=max_new_tokens, stop_id=stop_id
    )[0]


@torch.no_grad()
def speculative_generate_batch(
    target: Any,
    prompts: list[list[int]],
    proposers: list[Proposer],
    *,
    num_steps: int,
    max_new_tokens: int,
    stop_id: int,
) -> list[Generation]:
    """`speculative_generate` for many rows at once: one target forward per round verifies every row.

    Each row accepts its own drafts; a row that has finished leaves the batch. Rows with the same prompt
    (one per method) share its prefill, which runs unpadded, one prompt at a time.
    """
    aux_layer_ids = next((p.aux_layer_ids for p in proposers if p.aux_layer_ids is not None), None)
    prefills: dict[tuple[int, ...], Prefill] = {}
    for prompt in prompts:
        if tuple(prompt) not in prefills:
            prefills[tuple(prompt)] = prefill(target, prompt, aux_layer_ids)
    row_prefills = [prefills[tuple(prompt)] for prompt in prompts]
    # Each round appends at most num_steps + 1 slots and emits at least one token for every unfinished row.
    shared = SharedTargetCache(target, aux_layer_ids, row_prefills, room=max_new_tokens * (num_steps + 1))
    tokens = [[*prompt, p.first_token] for prompt, p in zip(prompts, row_prefills, strict=True)]
    new_aux = [p.aux for p in row_prefills]
    forwards = [0] * len(prompts)
    accepted_per_position = [[0] * num_steps for _ in prompts]

    def unfinished(row: int) -> bool:
        return len(tokens[row]) - len(prompts[row]) < max_new_tokens and tokens[row][-1] != stop_id

    def drop_finished(live: list[int]) -> list[int]:
        going_on = [slot for slot, row in enumerate(live) if unfinished(row)]
        if going_on and len(going_on) < len(live):
            shared.select(going_on)
        return [live[slot] for slot in going_on]

    live = drop_finished(list(range(len(prompts))))  # the rows in the shared cache, in its order
    while live:
        drafts: dict[int, list[int]] = {}
        by_proposer: dict[int, list[int]] = {}
        for row in live:
            by_proposer.setdefault(id(proposers[row]), []).append(row)
        for rows in by_proposer.values():
            proposed = proposers[rows[0]].propose(
                rows, [tokens[row] for row in rows], [new_aux[row] for row in rows], num_steps
            )
            for row, row_drafts in zip(rows, proposed, strict=True):
                drafts[row] = row_drafts[:num_steps]
        inputs = [[tokens[row][-1], *drafts[row]] for row in live]
        logits, aux = shared.forward(inputs, [len(tokens[row]) - 1 for row in live])
        for slot, row in enumerate(live):
            row_drafts = drafts[row]
            greedy = logits[slot, : len(inputs[slot])].argmax(-1).tolist()
            accepted = 0
            while accepted < len(row_drafts) and row_drafts[accepted] == greedy[accepted]:
                accepted_per_position[row][accepted] += 1
                accepted += 1
            forwards[row] += 1
            shared.keep(slot, logits.shape[1], accepted + 1)
            new_aux[row] = None if aux is None else aux[slot, : accepted + 1]
            for token in [*row_drafts[:accepted], greedy[accepted]]:
                tokens[row].append(token)
                if token == stop_id or len(tokens[row]) - len(prompts[row]) == max_new_tokens:
                    break
        live = drop_finished(live)
    return [
        Generation(row_tokens[len(prompt) :], row_forwards, row_accepted)
        for row_tokens, prompt, row_forwards, row_accepted in zip(
            tokens, prompts, forwards, accepted_per_position, strict=True
        )
    ]


def evaluate(
    drafter_dir: Path,
    target_dir: Path,
    prompts: list[list[int]],
    settings: EvalSettings,
    *,
    prompt_ids: list[str] | None = None,
    prompt_sets: list[str] | None = None,
) -> EvalReport:
    """eval.json: acceptance of the exported drafter, an untrained one and prompt lookup on `prompts`.

    The prompts go `batch_size` at a time, each with a row per method, through one target forward per round.
    `prompt_ids`/`prompt_sets` (one per prompt) label the prompts and give the per-set figures.
    """
    num_steps, topk, num_draft_tokens = settings.num_steps, settings.topk, settings.num_draft_tokens
    max_new_tokens, batch_size, seed = settings.max_new_tokens, settings.batch_size, settings.seed
    device, dtype = settings.device, settings.dtype
    if topk != 1 or num_draft_tokens != num_steps + 1:
        raise DrafterError(
            f"evaluation drafts one chain: use topk 1 and num_draft_tokens = num_steps + 1 "
            f"(got topk {topk}, num_steps {num_steps}, num_draft_tokens {num_draft_tokens})"
        )
    target, stop_id, trained = _open(drafter_dir, target_dir, prompts, dtype, device)
    untrained = untrained_like(trained, seed).to(target.device)
    methods: dict[str, Callable[[], Proposer]] = {
        "eagle3": lambda: EagleProposer(trained),
        "eagle3_untrained": lambda: EagleProposer(untrained),
        "prompt_lookup": PromptLookupProposer,
    }
    # Each per-prompt entry names its prompt, so a figure or a reader can trace it to its set.
    labels: list[PromptLabel] = (
        [{"prompt_id": pid, "set": ds} for pid, ds in zip(prompt_ids, prompt_sets, strict=True)]
        if prompt_ids is not None and prompt_sets is not None
        else [{} for _ in prompts]
    )
    started = time.perf_counter()
    runs_by_method = _generate_all(target, prompts, methods, num_steps, max_new_tokens, batch_size, stop_id)
    seconds = round(time.perf_counter() - started, 2)
    report: dict[str, MethodReport] = {
        name: {
            **_acceptance(runs, num_steps),
            "per_prompt": [
                {**label, **_acceptance([run], num_steps)} for label, run in zip(labels, runs, strict=True)
            ],
        }
        for name, runs in runs_by_method.items()
    }
    outputs = {name: [run.tokens for run in runs] for name, runs in runs_by_method.items()}
    result: EvalReport = {
        "methods": report,
        "held_out_prompts": len(prompts),
        "outputs_identical_across_methods": len({str(o) for o in outputs.values()}) == 1,
        "k": num_steps,
        "engine": ENGINE,
        "seconds": seconds,  # every method at once: they share the target's forwards
        "settings": {
            "num_steps": num_steps,
            "topk": topk,
            "num_draft_tokens": num_draft_tokens,
            "max_new_tokens": max_new_tokens,
            "batch_size": batch_size,
            "seed": seed,
            "decoding": "greedy",
            "device": str(target.device),
            "dtype": dtype,
        },
    }
    if prompt_ids is not None and prompt_sets is not None:
        result["prompts"] = [{"id": pid, "set": ds} for pid, ds in zip(prompt_ids, prompt_sets, strict=True)]
        result["per_set"] = {
            ds: {
                name: _acceptance([r for r, s in zip(runs, prompt_sets, strict=True) if s == ds], num_steps)
                for name, runs in runs_by_method.items()
            }
            for ds in dict.fromkeys(prompt_sets)
        }
    return result


def learning_curve(
    snapshot_dir: Path,
    final_dir: Path,
    target_dir: Path,
    prompts: list[list[int]],
    settings: EvalSettings,
) -> CurveReport:
    """curve.json: acceptance on `prompts` of each drafter training kept (`snapshot_dir/index.json`, the
    last point being the final drafter in `final_dir`), beside the untrained drafter (0 tokens seen) and
    prompt lookup, measured exactly as `evaluate` measures them (one chain of `settings.num_steps`)."""
    num_steps, max_new_tokens, batch_size = settings.num_steps, settings.max_new_tokens, settings.batch_size
    seed, device, dtype = settings.seed, settings.device, settings.dtype
    index = json.loads((Path(snapshot_dir) / "index.json").read_text())["points"]
    if not index:
        raise DrafterError(
            f"{snapshot_dir}/index.json lists no drafters: set drafter.curve_points (2 or more) and retrain"
        )
    target, stop_id, final = _open(final_dir, target_dir, prompts, dtype, device)
    untrained = untrained_like(final, seed).to(target.device)
    methods: dict[str, Callable[[], Proposer]] = {"untrained": lambda: EagleProposer(untrained)}
    for point in index:
        drafter = (
            final
            if point["dir"] is None
            else (load_exported(Path(snapshot_dir) / point["dir"], target_dir, dtype=dtype).to(target.device))
        )
        methods[f"step {point['step']}"] = functools.partial(EagleProposer, drafter)
    methods["prompt_lookup"] = PromptLookupProposer
    runs = _generate_all(target, prompts, methods, num_steps, max_new_tokens, batch_size, stop_id)
    measured = {name: _acceptance(method_runs, num_steps) for name, method_runs in runs.items()}
    points: list[CurvePoint] = [{"step": 0, "tokens_seen": 0, **measured["untrained"]}] + [
        {"step": point["step"], "tokens_seen": point["tokens_seen"], **measured[f"step {point['step']}"]}
        for point in index
    ]
    return {
        "points": points,
        "prompt_lookup": measured["prompt_lookup"],
        "held_out_prompts": len(prompts),
        "k": num_steps,
        "engine": ENGINE,
        "settings": {
            "max_new_tokens": max_new_tokens,
            "batch_size": batch_size,
            "seed": seed,
            "dtype": dtype,
        },
    }


def _open(
    drafter_dir: Path, target_dir: Path, prompts: list[list[int]], dtype: str, device: str
) -> tuple[Any, int, Eagle3Drafter]:
    """(target, its stop id, the exported drafter on the target's device), once there is work to do."""
    if not prompts:
        raise DrafterError("no held-out prompts to evaluate: hold some prompt ids out of training")
    target = load_target(target_dir, dtype=dtype, device=device)
    use_grouped_sdpa(target)  # the batched verify forward's mask would copy the KV cache per query group
    drafter = load_exported(drafter_dir, target_dir, dtype=dtype).to(target.device)
    return target, load_target_tokenizer(target_dir).stop_id, drafter


def _generate_all(
    target: Any,
    prompts: list[list[int]],
    methods: dict[str, Callable[[], Proposer]],
    num_steps: int,
    max_new_tokens: int,
    batch_size: int,
    stop_id: int,
) -> dict[str, list[Generation]]:
    """Every method's runs on every prompt: `batch_size` prompts at a time, each with one row per method,
    so one target forward per round verifies all methods and each prompt is prefilled once."""
    runs: dict[str, list[Generation]] = {name: [] for name in methods}
    for first in range(0, len(prompts), batch_size):
        batch = prompts[first : first + batch_size]
        proposers = [make_proposer() for make_proposer in methods.values()]
        rows = speculative_generate_batch(
            target,
            [prompt for _ in methods for prompt in batch],
            [proposer for proposer in proposers for _ in batch],
            num_steps=num_steps,
            max_new_tokens=max_new_tokens,
            stop_id=stop_id,
        )
        for index, name in enumerate(methods):
            runs[name] += rows[index * len(batch) : (index + 1) * len(batch)]
    return runs


def untrained_like(drafter: Eagle3Drafter, seed: int) -> Eagle3Drafter:
    """A freshly initialised drafter with the same config and vocabulary: the floor training must beat."""
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        fresh = Eagle3Drafter(drafter.config, drafter.embed_tokens.weight)
    fresh.set_draft_vocab(drafter.d2t, drafter.t2d)
    return fresh.to(drafter.embed_tokens.weight.dtype).eval()


def _acceptance(runs: list[Generation], num_steps: int) -> Acceptance:
    """Our acceptance length (emitted tokens per verify forward) and vLLM's counts for the same runs.

    vLLM's mean acceptance length is 1 + accepted_drafts / target_forwards; it exceeds ours only by the
    accepted drafts that the stop token or max_new_tokens cut, all in each prompt's last verify forward.
    """
    tokens = sum(run.verified_tokens for run in runs)
    forwards = sum(run.target_forwards for run in runs)
    accepted = [sum(run.accepted_per_position[i] for run in runs) for i in range(num_steps)]
    return {
        "acceptance_length": round(tokens / forwards, 4) if forwards else None,
        "target_forwards": forwards,
        "tokens": tokens,
        "accepted_drafts": sum(accepted),
        "accepted_per_position": accepted,
        "acceptance_rate_per_position": [round(a / forwards, 4) if forwards else None for a in accepted],
    }
