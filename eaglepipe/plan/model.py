"""What the spend plan knows: per set and run-wide, each figure None where it cannot be known yet."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from eaglepipe.config_types import Source
from eaglepipe.plan.hours import Hours

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
    # Where its answers come from (`answers`): only `openrouter` sets are bought.
    source: Source = Source.OPENROUTER
    # What the dollars buy of `output_tokens` (coverage): all of it, part, or none.
    bought_output_tokens: int | None = None
    # The tokens its hidden states hold (under hidden.max_samples / max_tokens), at what the dollars buy.
    hidden_tokens: int | None = None
    # Tokens (prompt and answer) and answers already journaled, and those still to buy were it bought in
    # full: what the hidden stage would read before its caps.
    done_tokens: int = 0
    done_samples: int = 0
    todo_tokens: int | None = None
    todo_samples: int | None = None

    @property
    def bought(self) -> bool:
        return self.source is Source.OPENROUTER

    @property
    def to_buy(self) -> bool:
        return self.status == "generate" and self.bought


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
    # budget.policy, and under `share` each bought set's part of budget.usd.
    policy: str = "share"
    share_usd: float | None = None
    # What the command builds: "drafter", "hidden states", "token ids" or "answers" (of the sets planned).
    goal: str = "drafter"
    hours: Hours | None = None
    # The share of bought output tokens that reached training in the sets tokenized so far (tokens.json
    # `yield`), and how many sets that is; None before any.
    measured_yield: float | None = None
    yield_sets: int = 0

    @property
    def remaining_usd(self) -> float:
        return max(self.budget_usd - self.spent_usd, 0.0)

    @property
    def has_work(self) -> bool:
        return any(item.status != "done" for item in self.sets)
