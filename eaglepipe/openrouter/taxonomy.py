"""Every way a request can go wrong, and what it means for the run: one table, read top to bottom.

Each failed attempt is matched against `FAILURES` in order; the first row that fits names the failure
(the summary's `errors_by_class`) and gives its verdict. A row fits by what the attempt showed: the HTTP
status (or the code of an error carried inside an HTTP 200), OpenRouter's error metadata (`limit_source`,
`provider_name`, `raw`), the wait headers (`ratelimit.py`), and what kind of thing failed (`Observed`).
`docs/generation.md` lists the same rows with where each shape was documented or reported; a test keeps
the two equal, and the tests' emulator can produce every row (`tests/support/emulator/shapes.py`).

Verdicts:
- `throttle`: "not now". Wait as told (the longest wait given; a rate-limit window's reset holds every new
  request of the job), never a strike against a provider, never a used-up attempt; a tick with several
  lowers the live concurrency (`concurrency.py`).
- `transient`: retry with backoff, up to `generation.max_attempts`.
- `provider_unusable`: the named provider's answers cannot be used: a strike (`breaker.py`), then retry (or,
  with `attempts`, give the prompt up after that many tries: a provider's 400 may be about the prompt).
- `prompt_permanent`: this prompt fails for good; recorded with the server's reason, not retried.
- `run_stop`: admit nothing new, let what is in flight finish, end resumable with `ended_because`.

Whether an answer that looks odd is nonetheless complete (a null `finish_reason` beside a
`native_finish_reason`, a stream that ended with `[DONE]`) is judged by `judge_finish`, from what the answer
contains; its decision and evidence go into the journal line.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Any, Literal, NotRequired, TypedDict

from eaglepipe.responses import FinishEvidence

if TYPE_CHECKING:
    from eaglepipe.openrouter.replies import RequestFailed


class Observed(StrEnum):
    """What failed, before any judgement: the `kind` of a `RequestFailed`."""

    HTTP = "http"  # a non-200 answer; `status` is its HTTP status
    ERROR_IN_200 = "error_in_200"  # an error inside an HTTP 200 (body, choice or stream chunk)
    EMPTY_CHOICES = "empty_choices"
    NOT_JSON = "not_json"  # an HTTP 200 whose body, or one of whose events, is not a JSON object
    UNFINISHED = "unfinished"  # the answer ended without any sign that it finished
    CONTENT_FILTER = "content_filter"
    NO_OUTPUT = "no_output"  # an answer that says it finished with nothing in it and nothing billed
    NETWORK = "network"  # no HTTP answer: refused, reset, broken body
    TIMEOUT = "timeout"
    FOREIGN_PROVIDER = "foreign_provider"  # served by a provider routing did not keep


Verdict = Literal["throttle", "transient", "provider_unusable", "prompt_permanent", "run_stop"]
Strike = Literal["none", "unusable", "server_error"]

IN_FLIGHT_BUDGET = "openrouter_in_flight_budget"
WEIGHT_EXCEEDS_BUDGET = "weight_exceeds_budget"
# A provider's own 400 may be its passing fault: this many tries (other providers may take it), then final.
PROVIDER_ERROR_ATTEMPTS = 3
_UNTIL_RESET = "(or wait until it resets), then rerun"
_CONTEXT = re.compile(r"context (length|window)|maximum context|too many tokens|prompt is too long", re.I)
_TOO_DEAR = re.compile(r"fewer max_tokens|can only afford", re.I)
_HTML = re.compile(r"<\s*(!doctype|html)", re.I)
# A provider's 429 that is about its own money, not its rate: it will not get better by waiting.
_BROKE = re.compile(r"insufficient (balance|funds|credit)|account (balance|is) (overdue|suspended)", re.I)


@dataclass(frozen=True)
class Shape:
    """One row: `fits` an attempt's failure; `strike` says what it proves about the provider it names
    (`server_error`: a provider's own 5xx, which counts only when it keeps happening there alone)."""

    name: str
    verdict: Verdict
    fits: Callable[[RequestFailed], bool]
    ended_because: str = ""
    advice: str = ""
    attempts: int | None = None
    strike: Strike = "none"


def _status(*codes: int) -> Callable[[RequestFailed], bool]:
    return lambda failure: failure.status in codes


def _html(failure: RequestFailed) -> bool:
    return bool(_HTML.search(failure.detail)) or (failure.content_type or "").startswith("text/html")


def _kind(kind: Observed) -> Callable[[RequestFailed], bool]:
    return lambda failure: failure.kind == kind


FAILURES: tuple[Shape, ...] = (
    # --- the run stops: nothing new can succeed until someone acts --------------------------------------
    Shape(
        "provider_unauthorized",
        "provider_unusable",
        lambda f: f.status == 401 and bool(f.provider_name),
        strike="unusable",
    ),
    Shape("unauthorized", "run_stop", _status(401), "unauthorized", "check the API key file, then rerun"),
    Shape(
        "request_too_dear",
        "run_stop",
        lambda f: (
            f.status in (402, 403)
            and (WEIGHT_EXCEEDS_BUDGET in (f.reason, f.code) or bool(_TOO_DEAR.search(f.detail)))
        ),
        "request_too_dear",
        "one request's reservation (prompt + generation.max_tokens at the endpoint's price) exceeds what "
        "the account may have in flight: lower generation.max_tokens or add credits, then rerun",
    ),
    Shape("in_flight_budget", "throttle", lambda f: f.status == 402 and f.limit_source == IN_FLIGHT_BUDGET),
    Shape(
        "key_limit",
        "run_stop",
        lambda f: f.status in (402, 403) and f.limit_source == "openrouter_key_limit",
        "key_limit",
        f"raise the key's limit {_UNTIL_RESET}",
    ),
    Shape(
        "credits_exhausted",
        "run_stop",
        _status(402),
        "credit_exhausted",
        "add credits or raise the key's limit, then rerun",
    ),
    Shape(
        "workspace_budget",
        "run_stop",
        lambda f: f.status == 403 and f.limit_source == "openrouter_workspace_budget",
        "budget_limit",
        f"raise the workspace budget {_UNTIL_RESET}",
    ),
    Shape(
        "guardrail_budget",
        "run_stop",
        lambda f: f.status == 403 and f.limit_source == "openrouter_guardrail_budget",
        "budget_limit",
        f"raise the guardrail's budget {_UNTIL_RESET}",
    ),
    Shape(
        "region_restricted",
        "run_stop",
        lambda f: f.status == 403 and f.reason == "region_restricted",
        "no_endpoint",
        "the model is not served to this region: run from another one",
    ),
    Shape(
        "model_not_found",
        "run_stop",
        lambda f: (
            f.status in (400, 404)
            and (f.reason == "model_not_found" or "not a valid model id" in f.detail.lower())
        ),
        "no_endpoint",
        "check api.model (the id as OpenRouter lists it), then rerun",
    ),
    Shape(
        "no_endpoint",
        "run_stop",
        _status(404),
        "no_endpoint",
        "check model and base_url, or relax `routing` and refresh providers.json",
    ),
    Shape(
        "redirected",
        "run_stop",
        lambda f: f.status is not None and 300 <= f.status < 400,
        "no_endpoint",
        "api.base_url answers with a redirect: set it to the address it points to",
    ),
    Shape(
        "daily_rate_limit",
        "run_stop",
        lambda f: f.status == 429 and f.limit_source == "openrouter_free_tier_daily",
        "rate_limited",
        "a daily request limit (free models): rerun after it resets, or use a paid model",
    ),
    # --- this prompt, for good ------------------------------------------------------------------------
    Shape("moderation", "prompt_permanent", _status(403)),
    Shape(
        "context_too_long",
        "prompt_permanent",
        lambda f: (
            f.status in (400, 413)
            and (f.reason == "context_length_exceeded" or bool(_CONTEXT.search(f"{f.detail} {f.raw or ''}")))
        ),
    ),
    Shape(
        "provider_refused",
        "provider_unusable",
        lambda f: f.status == 400 and bool(f.provider_name),
        attempts=PROVIDER_ERROR_ATTEMPTS,
        strike="unusable",
    ),
    Shape("bad_request", "prompt_permanent", _status(400)),
    Shape("payload_too_large", "prompt_permanent", _status(413)),
    Shape("unprocessable", "prompt_permanent", _status(422)),
    Shape("content_filter", "prompt_permanent", _kind(Observed.CONTENT_FILTER)),
    # --- throttling: wait as told, fewer in flight, never a verdict on a provider ---------------------
    Shape(
        "provider_out_of_balance",
        "provider_unusable",
        lambda f: f.status == 429 and bool(f.provider_name) and bool(_BROKE.search(f.raw or "")),
        strike="unusable",
    ),
    Shape(
        "provider_rate_limited_window",
        "throttle",
        lambda f: f.status == 429 and bool(f.provider_name) and f.wait is not None and f.wait.window,
    ),
    Shape("provider_rate_limited", "throttle", lambda f: f.status == 429 and bool(f.provider_name)),
    Shape("capacity_exhausted", "throttle", lambda f: f.status == 429 and f.reason == "capacity_exhausted"),
    Shape(
        "account_rate_limited",
        "throttle",
        lambda f: f.status == 429 and f.wait is not None and f.wait.window,
    ),
    Shape("rate_limited", "throttle", _status(429)),
    Shape("overloaded", "throttle", _status(529)),
    # --- transient: retry with backoff ------------------------------------------------------------------
    Shape("request_timeout", "transient", _status(408)),
    Shape("edge_error", "transient", lambda f: f.status is not None and f.status >= 500 and _html(f)),
    Shape(
        "provider_server_error",
        "transient",
        lambda f: f.status is not None and f.status >= 500 and bool(f.provider_name),
        strike="server_error",
    ),
    Shape("unavailable", "transient", _status(503)),
    Shape("gateway_timeout", "transient", _status(504, 524)),
    Shape("server_error", "transient", lambda f: f.status is not None and f.status >= 500),
    # --- HTTP 200s that are no answer ------------------------------------------------------------------
    Shape(
        "error_in_200_uncoded",
        "provider_unusable",
        lambda f: f.kind == Observed.ERROR_IN_200 and f.status is None,
        strike="unusable",
    ),
    Shape("empty_choices", "transient", _kind(Observed.EMPTY_CHOICES)),
    Shape("no_output", "transient", _kind(Observed.NO_OUTPUT)),
    Shape("not_json", "transient", _kind(Observed.NOT_JSON)),
    # A stream its provider ends cleanly before the answer does is billed in full and cannot be used:
    # evidence, so a provider that does it again and again is dropped instead of bought from six times.
    Shape("unfinished", "provider_unusable", _kind(Observed.UNFINISHED), strike="unusable"),
    Shape("network", "transient", _kind(Observed.NETWORK)),
    Shape("timeout", "transient", _kind(Observed.TIMEOUT)),
    Shape("foreign_provider", "provider_unusable", _kind(Observed.FOREIGN_PROVIDER)),
    # --- anything else: another 4xx is about the request, anything unknown is worth a retry -----------
    Shape("client_error", "prompt_permanent", lambda f: f.status is not None and 400 <= f.status < 500),
    Shape("unknown", "transient", lambda f: True),
)
_BY_NAME = {shape.name: shape for shape in FAILURES}


# OpenRouter's typed errors (`error.metadata.error_type`, or a string `code` such as the streaming page's
# "server_error"): the HTTP status each stands for, so an error inside an HTTP 200 is judged like one.
TYPED_STATUS = {
    "invalid_request": 400,
    "invalid_prompt": 400,
    "context_length_exceeded": 400,
    "max_tokens_exceeded": 400,
    "token_limit_exceeded": 400,
    "string_too_long": 400,
    "content_policy_violation": 400,
    "refusal": 400,
    "authentication": 401,
    "payment_required": 402,
    "permission_denied": 403,
    "not_found": 404,
    "precondition_failed": 412,
    "payload_too_large": 413,
    "unprocessable": 422,
    "rate_limit_exceeded": 429,
    "rate_limited": 429,
    "server": 500,
    "server_error": 500,
    "unmapped": 500,
    "provider_unavailable": 502,
    "provider_overloaded": 503,
    "timeout": 504,
}


def classify(failure: RequestFailed) -> Shape:
    """The first row that fits; the last row fits everything."""
    return next(shape for shape in FAILURES if shape.fits(failure))


def shape_named(name: str) -> Shape:
    return _BY_NAME[name]


# --- answers that look odd but are complete ---------------------------------------------------------------

# What providers send as `finish_reason` or `native_finish_reason`, normalised to OpenAI's names.
_FINISH_NAMES = {
    "stop": (
        "stop",
        "end_turn",
        "eos",
        "eos_token",
        "stop_sequence",
        "end",
        "complete",
        "completed",
        "finish_reason_stop",
    ),
    "length": ("length", "max_tokens", "max_output_tokens", "model_length", "max_completion_tokens"),
    "tool_calls": ("tool_calls", "tool_use", "tool_call", "function_call"),
    "content_filter": (
        "content_filter",
        "safety",
        "recitation",
        "prohibited_content",
        "blocklist",
        "spii",
        "refusal",
    ),
    "error": ("error",),
}
_NORMALISED = {native: name for name, natives in _FINISH_NAMES.items() for native in natives}
_FAILED_FINISHES = {"content_filter": Observed.CONTENT_FILTER, "error": Observed.ERROR_IN_200}

# The answer shapes `judge_finish` keeps, as the table in docs/generation.md names them.
ANSWER_SHAPES = (
    "finish_unnormalised",  # finish_reason is a provider's own name (end_turn, MAX_TOKENS, ...)
    "finish_native_only",  # finish_reason null, native_finish_reason says how it ended
    "finish_missing_done",  # a stream without any finish reason that ended with [DONE]
    "finish_missing_whole_body",  # a non-streamed answer without any finish reason
)


class KeptLogprob(TypedDict):
    """An output token's logprob entry as the journal keeps it: as sent, without its alternatives."""

    token: Any
    bytes: Any
    logprob: Any


class KeptLogprobs(TypedDict):
    content: list[KeptLogprob]


class ReplyAnswer(TypedDict):
    """An answer as the reply reader gathers it, before its finish is judged. The tool calls and
    reasoning details are as the provider sent them (or as a stream's pieces joined up): not yet checked,
    which is what `judge_finish` does to the calls."""

    content: str
    reasoning: str | None
    tool_calls: list[dict[str, Any]]
    reasoning_details: NotRequired[list[Any]]
    reasoning_encrypted: NotRequired[bool]
    token_ids: NotRequired[list[int]]
    prompt_token_ids: NotRequired[list[int]]
    logprobs: NotRequired[KeptLogprobs]


class EvidenceField(TypedDict, total=False):
    finish_evidence: FinishEvidence


@dataclass(frozen=True)
class Finish:
    """How an answer ended (`reason`: stop, length or tool_calls) and, when that was not simply said,
    the evidence it was read from (`shape`, `native`)."""

    reason: str
    shape: str | None = None
    native: str | None = None

    def evidence(self) -> EvidenceField:
        """What the journal line keeps of the decision: nothing when `finish_reason` said it."""
        if self.shape is None:
            return {}
        evidence: FinishEvidence = {"shape": self.shape}
        if self.native:
            evidence["native"] = self.native
        return {"finish_evidence": evidence}


def normalised_finish(name: Any) -> str | None:
    return _NORMALISED.get(name.strip().lower()) if isinstance(name, str) and name.strip() else None


def judge_finish(
    finish_reason: Any,
    native_finish_reason: Any,
    *,
    ended_whole: bool,
    streamed: bool,
    answer: ReplyAnswer,
    completion_tokens: Any,
    max_tokens: Any,
) -> Finish | Observed:
    """How the answer ended, judged by what it contains; else what makes it no answer (`UNFINISHED`
    when nothing shows it finished: a cut).

    `ended_whole`: the stream ended with `[DONE]`, or the plain body was read whole. An answer whose
    finish reason is missing is complete only when it ended whole and its message is well formed (some
    output, every tool call's arguments JSON); then it stopped, or was cut at `max_tokens` when its
    billed length reaches that."""
    said = normalised_finish(finish_reason)
    native = normalised_finish(native_finish_reason)
    output = bool(answer.get("content") or answer.get("reasoning") or answer.get("tool_calls"))
    if (said or native) in ("stop", "tool_calls") and not output and not completion_tokens:
        return Observed.NO_OUTPUT
    if said is not None:
        if said in _FAILED_FINISHES:
            return _FAILED_FINISHES[said]
        return Finish(said) if finish_reason == said else Finish(said, "finish_unnormalised", finish_reason)
    if native in _FAILED_FINISHES:
        return _FAILED_FINISHES[native]
    if native is not None:
        return Finish(native, "finish_native_only", str(native_finish_reason))
    if not ended_whole or not output:
        return Observed.UNFINISHED
    shape = "finish_missing_done" if streamed else "finish_missing_whole_body"
    if isinstance(completion_tokens, int) and isinstance(max_tokens, int) and completion_tokens >= max_tokens:
        return Finish("length", shape)
    if not _calls_whole(answer):
        return Observed.UNFINISHED
    return Finish("tool_calls" if answer.get("tool_calls") else "stop", shape)


def _calls_whole(answer: ReplyAnswer) -> bool:
    """Every tool call's arguments are JSON: a call cut off mid-way is not a finished answer."""
    for call in answer.get("tool_calls") or ():
        arguments = (call.get("function") or {}).get("arguments") or "{}"
        try:
            json.loads(arguments)
        except ValueError:
            return False
    return True
