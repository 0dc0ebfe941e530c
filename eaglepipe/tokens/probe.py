"""The token stage's structural check, offered to generation as a usability probe.

Generation calls this on each provider's first answers while it buys them, so a provider whose answers
the token stage would refuse (a missing stop, markers out of order, reasoning billed but not returned) or
that leaks markers' text into its answers is found after a few dollars, not after the whole budget. The one
place generation uses the token stage.

A marker's text in an answer is held against the provider only when the bill says a parser leaked it (see
`validate.marker_text_problem`): the probe rebuilds each answer alone, without the provider's profile, so
an answer from an engine that strips whitespace can miss its bill by a token or two for no fault of the
text it holds.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from pathlib import Path

from eaglepipe.prompts.records import PromptRecord
from eaglepipe.responses import ResponseRecord
from eaglepipe.target.chat_format import chat_format_for
from eaglepipe.target.load import load_target_tokenizer
from eaglepipe.tokens.rebuild import Rebuilder, TokenSettings
from eaglepipe.tokens.reply import parse_reply
from eaglepipe.tokens.validate import marker_text_problem

log = logging.getLogger(__name__)

# The probe's own settings, not the config's (generation does not read the `tokens` section): no provider
# pins, since each answer is rebuilt alone, and the tokenizer's own tool declarations first (the other
# format is still tried where only it renders). The keep/drop choices are unused: the probe reads only
# the sample's problem.
PROBE_SETTINGS = TokenSettings(
    on_mismatch="keep", on_ambiguous="keep", on_segmentation="keep", tool_format="typescript", providers={}
)


def usability_probe(target_dir: Path) -> Callable[[PromptRecord, ResponseRecord], str | None] | None:
    """`probe(prompt, record)`: why the journaled answer cannot be trained on, or None. None (and a warning)
    when the target's tokenizer is not at `target_dir`, e.g. on a login node without the weights."""
    try:
        chat = chat_format_for(load_target_tokenizer(target_dir))
    except (OSError, ValueError) as err:
        log.warning("no usability probe: the target's tokenizer at %s cannot be loaded (%s)", target_dir, err)
        return None
    rebuilder = Rebuilder(chat, PROBE_SETTINGS)
    # Generation calls the probe from worker threads, several answers at once, and the rebuild is not
    # thread-safe: run concurrently, sound answers came out as prompt_without_generation_prompt.
    one_at_a_time = threading.Lock()

    def problem(prompt: PromptRecord, record: ResponseRecord) -> str | None:
        with one_at_a_time:
            return _problem(prompt, record)

    def _problem(prompt: PromptRecord, record: ResponseRecord) -> str | None:
        try:
            (sample,) = rebuilder.rebuild({prompt["id"]: prompt}, [record], "usability probe").samples
        except ValueError as err:  # a prompt the token stage cannot render is not the provider's fault
            log.warning("prompt %s: usability probe skipped (%s)", prompt["id"], err)
            return None
        if sample.problem:
            return sample.problem
        excess = None if sample.billed_completion is None else sample.billed_diff
        return marker_text_problem(chat, parse_reply(record, "usability probe").texts, excess=excess)

    return problem
