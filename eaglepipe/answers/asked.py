"""A set asked of a server, bought or the team's own engine: the same client, journal, resume, concurrency,
output-token budget and progress line. A prompt set in, `responses.jsonl` out or one line saying how far it
got; the journal is always saved first, so a failed job loses nothing paid for."""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio

from eaglepipe.answers.job import AnswersJob
from eaglepipe.io import write_json
from eaglepipe.openrouter.client import GenerationSettings, GenerationSummary, UsabilityProbe, generate_set
from eaglepipe.openrouter.dollars import DollarBudget
from eaglepipe.openrouter.errors import OpenRouterError
from eaglepipe.openrouter.journal import load_done
from eaglepipe.openrouter.secrets import ApiKey
from eaglepipe.openrouter.settings import OperationalParams
from eaglepipe.processes import JobStopped
from eaglepipe.prompts.records import read_prompt_set
from eaglepipe.responses import write_responses
from eaglepipe.tokens.probe import usability_probe

log = logging.getLogger(__name__)

# A set is complete when every prompt was answered or when its token budget was reached: only the
# configured budgets end a set (raising one reruns the job, which resumes from the journal).
COMPLETE = {"all_done", "token_budget"}
# What to do about an unfinished set, by `ended_because`; anything else is resumed by a plain rerun.
ADVICE = {
    "failures": "see the summary for why; rerun to retry them",
    "dollar_budget": "raise budget.usd, then rerun to resume",
    "no_usable_provider": "the summary's `breaker` says what each provider returned; fix routing, then rerun",
    "foreign_provider": "refresh providers.json (.venv/bin/snakemake --forcerun providers), then rerun",
    "rate_limited": "rerun once the rate limit has reset (the time is above)",
}


@dataclass(frozen=True, kw_only=True)
class AskedSet:
    """What a set asked of a server runs with besides its source's own request: the run's generation_settings
    file (how jobs run: an ancient input, so changing it reruns no finished set), the journal and the ledger
    its spending is booked in."""

    fingerprint: str
    operational: OperationalParams
    journal: Path
    ledger: Path
    max_failed_fraction: float

    @classmethod
    def from_rule(cls, params: Mapping[str, Any]) -> AskedSet:
        settings_path = Path(params["settings"])
        if not settings_path.is_file():
            raise OpenRouterError(
                f"{settings_path} is missing (a set answered before it existed is rerun): write it with "
                "`.venv/bin/snakemake generation_settings`, then rerun"
            )
        return cls(
            fingerprint=params["fingerprint"],
            operational=json.loads(settings_path.read_text()),
            journal=Path(params["journal"]),
            ledger=Path(params["ledger"]),
            max_failed_fraction=params["max_failed_fraction"],
        )

    @property
    def target_path(self) -> Path:
        return Path(self.operational["target_path"])


@contextmanager
def probe_loading(target_dir: Path | None) -> Iterator[Future]:
    """The usability probe, loading in a thread from the start of the block: its tokenizer takes seconds,
    as does the server the job starts meanwhile, and neither needs the other."""
    with ThreadPoolExecutor(max_workers=1) as loader:
        yield loader.submit(lambda: usability_probe(target_dir) if target_dir else None)


def generate_responses(
    prompts_path: Path,
    out_path: Path,
    summary_path: Path,
    journal_dir: Path,
    ledger_dir: Path,
    dataset: str,
    settings: GenerationSettings,
    api_key: ApiKey | None,
    probe: UsabilityProbe | None = None,
) -> GenerationSummary:
    """Generate what the journal lacks, write the summary, then either write `responses.jsonl` (in prompt
    order, atomically) or raise, leaving it unwritten so Snakemake sees the job failed. `ledger_dir` is the
    run-wide ledger this set's spending is booked in, as `dataset`; `settings.dollar_budget`, the budget it
    ran under, says whether a set its share of budget.usd stopped is complete for now, and is recorded in
    the summary (eaglepipe/openrouter/dollars.py reads it back)."""
    dollars = settings.dollar_budget
    prompts = read_prompt_set(prompts_path)
    run_set = functools.partial(
        generate_set,
        prompts,
        settings=settings,
        api_key=api_key,
        journal_dir=journal_dir,
        ledger_dir=ledger_dir,
        dataset=dataset,
        probe=probe,
    )
    try:
        summary = anyio.run(run_set)
    except KeyboardInterrupt:  # the journal closed with every answer received so far: a rerun resumes
        raise JobStopped(f"{len(load_done(journal_dir, settings.fingerprint))} answers kept") from None
    summary.dollar_budget = dollars.to_param() if dollars else None
    summary.fingerprint = settings.fingerprint
    summary.output_token_budget = settings.output_token_budget
    if _partial_for_now(summary, dollars):
        summary.partial = "dollar_budget"
    write_json(summary_path, summary.to_json())
    if summary.ended_because not in COMPLETE and summary.partial is None:
        advice = ADVICE.get(summary.ended_because, "rerun to resume")
        if summary.ended_because == "dollar_budget" and dollars and dollars.partial_when_spent:
            advice = (
                "its share of budget.usd holds no new answer (every earlier run's spending on the set "
                "counts, under other request settings too) or waits on requests not priced yet: raise "
                "budget.usd, or rerun once they are priced"
            )
        raise OpenRouterError(
            f"{prompts_path}: {summary.done}/{summary.requested} prompts done, "
            f"${summary.dollars:.4f} spent on this set (${summary.run_dollars:.4f} by the run), "
            f"ended by {summary.ended_because} ({summary.message}): {advice}"
        )
    records = load_done(journal_dir, settings.fingerprint)
    write_responses((records[p["id"]] for p in prompts if p["id"] in records), out_path)
    if summary.partial:
        log.warning(
            "%s: its share of budget.usd bought %d of %d prompts ($%.4f); complete for now, trained on as it "
            "is: raise budget.usd and rerun to buy the rest",
            out_path, summary.done, summary.requested, summary.dollars,
        )
    return summary


def _partial_for_now(summary: GenerationSummary, dollars: DollarBudget | None) -> bool:
    """Under budget.policy `share`, the dollars ending a set leave it complete with what it bought. Not
    while some of its requests are still unpriced after the job's own settlement (a kill's, held at their
    worst case until `/generation` prices them): the budget may not be spent, and a rerun finds out. A
    set with no answer has nothing to train on. Both stay unfinished, resumable."""
    return (
        summary.ended_because == "dollar_budget"
        and dollars is not None
        and dollars.partial_when_spent
        and summary.done > 0
        and summary.unresolved == 0
    )


def ask_server(
    job: AnswersJob,
    asked: AskedSet,
    settings: GenerationSettings,
    api_key: ApiKey | None,
    probe: UsabilityProbe | None,
) -> GenerationSummary:
    """`generate_responses` for a job, with its set's journal and ledger; the job's one-line account."""
    summary = generate_responses(
        job.prompts, job.responses, job.summary, asked.journal, asked.ledger, job.dataset, settings, api_key,
        probe,
    )
    if settings.paid:
        spent = f", ${summary.dollars:.4f}" + (" (emulated: nothing bought)" if settings.emulated else "")
    else:
        spent = f" from the {settings.server_name} engine"
    log.info(
        "%s: %d done (%d resumed, %d truncated at max_tokens %d), %d tokens%s",
        job.responses,
        summary.done,
        summary.resumed,
        summary.truncated,
        settings.max_tokens,
        summary.completion_tokens,
        spent,
    )
    return summary
