"""Acceptance length in a real draft-and-verify loop against the HF target (greedy, one draft chain).

Every method emits exactly the target's greedy output; they differ only in how many target forwards it
takes. Acceptance length as SGLang reports it: tokens emitted per verify forward (accepted drafts plus
the target's bonus token), so 1.0 means the drafts never helped. The drafter runs with the training
alignment: after the target has verified position t, the drafter consumes (aux[t], token t+1).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import Tensor
from transformers import DynamicCache

from eaglepipe.drafter import DrafterError
from eaglepipe.drafter.export import load_exported
from eaglepipe.drafter.model import DraftCache, Eagle3Drafter
from eaglepipe.progress import StepProgress
from eaglepipe.target.chat import stop_token_id
from eaglepipe.target.load import load_target

PROMPT_LOOKUP_MAX_NGRAM = 3

log = logging.getLogger(__name__)


class Proposer(Protocol):
    aux_layer_ids: list[int] | None  # target layers whose outputs `propose` needs; None: no hidden states

    def propose(self, tokens: list[int], new_aux: Tensor | None, num_steps: int) -> list[int]:
        """Up to `num_steps` guesses of the tokens after `tokens`.

        `new_aux` [n, 3H] holds the aux states of the n positions verified since the last call, which
        are the last n positions before the final token of `tokens`.
        """
        ...


class EagleProposer:
    def __init__(self, drafter: Eagle3Drafter) -> None:
        self.drafter = drafter
        self.aux_layer_ids = list(drafter.config.aux_layer_ids)
        self.cache = DraftCache()

    @torch.no_grad()
    def propose(self, tokens: list[int], new_aux: Tensor | None, num_steps: int) -> list[int]:
        start = self.cache.length
        ids = torch.tensor([tokens[start + 1 : start + 1 + len(new_aux)]], device=new_aux.device)
        logits, hidden = self.drafter(ids, new_aux[None], self.cache)
        logits, hidden = logits[:, -1:], hidden[:, -1:]
        drafts: list[int] = []
        for _ in range(num_steps):
            draft = self.drafter.draft_to_target(logits.argmax(-1))
            drafts.append(int(draft))
            if len(drafts) < num_steps:
                logits, hidden = self.drafter(draft, hidden, self.cache)
        return drafts


class PromptLookupProposer:
    """Copy what followed the most recent earlier occurrence of the last n tokens (n = 3, then 2, 1)."""

    aux_layer_ids = None

    def propose(self, tokens: list[int], new_aux: Tensor | None, num_steps: int) -> list[int]:
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
    accepted: list[int]  # drafts accepted in each verify forward

    @property
    def verified_tokens(self) -> int:
        """Tokens the verify forwards emitted: all but the first, which the prefill produced."""
        return max(len(self.tokens) - 1, 0)


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
    cache = DynamicCache()
    logits, aux = _target_forward(target, prompt_ids, cache, proposer.aux_layer_ids)
    tokens = [*prompt_ids, int(logits[-1].argmax())]
    accepted_per_round: list[int] = []
    while len(tokens) - len(prompt_ids) < max_new_tokens and tokens[-1] != stop_id:
        drafts = proposer.propose(tokens, aux, num_steps)[:num_steps]
        logits, aux = _target_forward(target, [tokens[-1], *drafts], cache, proposer.aux_layer_ids)
        greedy = logits.argmax(-1).tolist()
        accepted = 0
        while accepted < len(drafts) and drafts[accepted] == greedy[accepted]:
            accepted += 1
        accepted_per_round.append(accepted)
        cache.crop(-(len(drafts) - accepted))  # the rejected drafts; crop(-0) keeps everything
        aux = None if aux is None else aux[: accepted + 1]
        for token in [*drafts[:accepted], greedy[accepted]]:
            tokens.append(token)
            if token == stop_id or len(tokens) - len(prompt_ids) == max_new_tokens:
                break
    return Generation(tokens[len(prompt_ids) :], len(accepted_per_round), accepted_per_round)


def evaluate(
    drafter_dir: Path,
    target_dir: Path,
    prompts: list[list[int]],
    *,
    num_steps: int = 3,
    topk: int = 1,
    num_draft_tokens: int = 4,
    max_new_tokens: int = 128,
    seed: int = 0,
    device: str = "cpu",
    dtype: str = "float32",
    labels: list[dict[str, str]] | None = None,
) -> dict[str, Any]:
    """eval.json: acceptance of the exported drafter, an untrained one and prompt lookup on `prompts`.

    `labels[i]` (the prompt's id and set) is copied into its per-prompt entries, so they can be traced."""
    if topk != 1 or num_draft_tokens != num_steps + 1:
        raise DrafterError(
            f"evaluation drafts one chain: use topk 1 and num_draft_tokens = num_steps + 1 "
            f"(got topk {topk}, num_steps {num_steps}, num_draft_tokens {num_draft_tokens})"
        )
    if not prompts:
        raise DrafterError("no held-out prompts to evaluate: hold some prompt ids out of training")
    target, tokenizer = load_target(target_dir, dtype=dtype, device=device)
    stop_id = stop_token_id(tokenizer)
    trained = load_exported(drafter_dir, target_dir, dtype=dtype).to(target.device)
    untrained = untrained_like(trained, seed).to(target.device)
    methods = {
        "eagle3": lambda: EagleProposer(trained),
        "eagle3_untrained": lambda: EagleProposer(untrained),
        "prompt_lookup": PromptLookupProposer,
    }
    labels = labels or [{} for _ in prompts]
    report: dict[str, dict[str, Any]] = {}
    outputs: dict[str, list[list[int]]] = {}
    progress = StepProgress(log, "evaluation", len(methods) * len(prompts), unit="generations")
    for name, make_proposer in methods.items():
        started = time.perf_counter()
        runs = []
        for prompt in prompts:
            runs.append(
                speculative_generate(
                    target,
                    prompt,
                    make_proposer(),
                    num_steps=num_steps,
                    max_new_tokens=max_new_tokens,
                    stop_id=stop_id,
                )
            )
            progress.advance(1, len(runs[-1].tokens))
        report[name] = {
            **_acceptance(runs, num_steps),
            "seconds": round(time.perf_counter() - started, 2),
            "per_prompt": [
                {**label, **_acceptance([run], num_steps)} for label, run in zip(labels, runs, strict=True)
            ],
        }
        outputs[name] = [run.tokens for run in runs]
    return {
        "methods": report,
        "held_out_prompts": len(prompts),
        "outputs_identical_across_methods": len({str(o) for o in outputs.values()}) == 1,
        "settings": {
            "num_steps": num_steps,
            "topk": topk,
            "num_draft_tokens": num_draft_tokens,
            "max_new_tokens": max_new_tokens,
            "seed": seed,
            "decoding": "greedy",
            "device": str(target.device),
            "dtype": dtype,
        },
    }


def untrained_like(drafter: Eagle3Drafter, seed: int) -> Eagle3Drafter:
    """A freshly initialised drafter with the same config and vocabulary: the floor training must beat."""
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        fresh = Eagle3Drafter(drafter.config, drafter.embed_tokens.weight)
    fresh.set_draft_vocab(drafter.d2t, drafter.t2d)
    return fresh.to(drafter.embed_tokens.weight.dtype).eval()


def _target_forward(
    target: Any, ids: list[int], cache: DynamicCache, aux_layer_ids: list[int] | None
) -> tuple[Tensor, Tensor | None]:
    """(logits [n, V], aux [n, 3H] or None) for `ids` appended to the cached context."""
    out = target(
        input_ids=torch.tensor([ids], device=target.device),
        cache=cache,
        use_cache=True,
        output_hidden_states=aux_layer_ids is not None,
    )
    if aux_layer_ids is None:
        return out.logits[0], None
    return out.logits[0], torch.cat([out.hidden_states[i + 1][0] for i in aux_layer_ids], dim=-1)


def _acceptance(runs: list[Generation], num_steps: int) -> dict[str, Any]:
    """Acceptance length, and per draft position k the share of verify forwards that accepted drafts
    1..k (the rate SGLang's speculative metrics report per position)."""
    tokens = sum(run.verified_tokens for run in runs)
    rounds = [accepted for run in runs for accepted in run.accepted]
    return {
        "acceptance_length": round(tokens / len(rounds), 4) if rounds else None,
        "acceptance_by_position": [
            round(sum(accepted > k for accepted in rounds) / len(rounds), 4) if rounds else None
            for k in range(num_steps)
        ],
        "target_forwards": len(rounds),
        "tokens": tokens,
    }
