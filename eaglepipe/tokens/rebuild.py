"""From prompts and replies to samples: prompt ids, completion ids, how they were obtained, what is in doubt.

Two passes. The first reads every reply, checks any exact ids it carries and gathers per-provider evidence
(`profile`); the second renders each prompt and rebuilds each completion under its provider's profile.
A `text_only` rebuilder reads every reply as if the server had returned no ids: the round-trip gate
(`round_trip`) compares what it rebuilds with the server's ids.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from functools import cached_property

from eaglepipe.config_types import TokensSection
from eaglepipe.errors import EaglepipeError
from eaglepipe.messages import ToolCall
from eaglepipe.prompts.records import PromptRecord
from eaglepipe.responses import ResponseRecord
from eaglepipe.target.chat_format import ChatFormat
from eaglepipe.target.kimi_chat import tool_history
from eaglepipe.target.kimi_tools import ToolFormat
from eaglepipe.target.segments import RenderError, Special
from eaglepipe.tokens.candidates import KNOWN_SOURCES, PieceCache, Selection, Variant, select, shape_of
from eaglepipe.tokens.exact import ExactIds, exact_completion, ids_from_bytes, with_stop
from eaglepipe.tokens.methods import Flag, Method
from eaglepipe.tokens.normalize import unpad_edit
from eaglepipe.tokens.pieces import NO_EDIT
from eaglepipe.tokens.profile import EngineProfile, Evidence, ProviderPin, decide_profile
from eaglepipe.tokens.reply import Reply, parse_reply
from eaglepipe.tokens.validate import marker_text, structure_problem

# Replies each bills probe (stop billing, reasoning end) reads per provider; readings that fit the bill.
PROBE_REPLIES = 64
# Share of the probed replies that only a restored reasoning end fits, from which the engine strips it.
RSTRIP_RESCUED = 0.15
FITTING = (Method.REBUILT_COUNT_MATCHED, Method.REBUILT_AMBIGUOUS)
# The largest count miss a split alone is taken to explain: SPLIT_MISS_FLOOR plus SPLIT_MISS_SHARE of the
# answer's ids. SmolLM2 through real vLLM at temperature 1.0 (docs/tokens.md): every split-only miss within
# 2 + 3.1% (11 tokens at most, in a 1,024-token answer).
SPLIT_MISS_FLOOR = 2
SPLIT_MISS_SHARE = 0.05


class TokensError(EaglepipeError, ValueError):
    """A token-stage input problem, in one line."""


@dataclass(frozen=True)
class TokenSettings:
    """The `tokens` section of the config (schemas/config.schema.yaml holds the defaults)."""

    on_mismatch: str
    on_ambiguous: str
    on_segmentation: str
    tool_format: ToolFormat
    providers: dict[str, ProviderPin]

    @classmethod
    def from_section(cls, section: TokensSection) -> TokenSettings:
        """From the validated config's `tokens` section."""
        return cls(
            on_mismatch=section["on_mismatch"],
            on_ambiguous=section["on_ambiguous"],
            on_segmentation=section["on_segmentation"],
            tool_format=section["tool_format"],
            providers={name: ProviderPin.from_config(entry) for name, entry in section["providers"].items()},
        )


@dataclass(frozen=True)
class ServerPrompt:
    """The server's prompt ids against our rendering of the prompt."""

    first_difference: int | None  # the first position where they differ (None: the same ids)
    server_length: int
    rendered_length: int


@dataclass
class RebuiltSample:
    """One reply as the token stage rebuilt it: ids, how they were obtained, and what is in doubt."""

    prompt_id: str
    provider: str
    prompt_ids: list[int]
    completion_ids: list[int]
    method: Method
    flags: Flag
    billed_prompt: int | None
    billed_completion: int | None
    billed_diff: int  # the completion's billable length minus the bill (0 without a bill)
    as_returned_diff: int | None  # the same for the text encoded as returned, no reading undone
    prompt_diffs: dict[str, int]  # tool-declaration format -> rendered prompt length minus the bill
    problem: str | None  # why the sample is malformed, or None
    server_prompt: ServerPrompt | None  # None when the server returned no prompt ids
    server_completion: list[int] | None  # the server's ids as the exact path resolves them (stop added)


@dataclass
class Rebuilt:
    samples: list[RebuiltSample]
    profiles: dict[str, EngineProfile]
    evidence: dict[str, Evidence]


@dataclass
class _Pending:
    prompt: PromptRecord
    reply: Reply
    history: int
    exact: ExactIds | None
    exact_method: Method | None
    rejected: bool
    pieces: PieceCache | None = None  # encodings made by the bills probes, reused

    @cached_property
    def padding(self) -> tuple[int, int]:
        """`pad_signature` of the reply: read by the provider's evidence and again by its own reading."""
        return pad_signature(self.reply)


class Rebuilder:
    def __init__(self, chat: ChatFormat, settings: TokenSettings, *, text_only: bool = False) -> None:
        self.chat = chat
        self.settings = settings
        self.shape = shape_of(chat)
        self.text_only = text_only

    def rebuild(
        self, prompts: dict[str, PromptRecord], records: Iterable[ResponseRecord], where: str
    ) -> Rebuilt:
        pending = [self._first_pass(prompts, record, where) for record in records]
        evidence: dict[str, Evidence] = {}
        for item in pending:
            self._gather(evidence.setdefault(item.reply.provider, Evidence()), item)
        profiles = {
            name: decide_profile(found, self.settings.providers.get(name, ProviderPin()))
            for name, found in evidence.items()
        }
        for name, profile in profiles.items():
            items = [p for p in pending if p.reply.provider == name]
            if profile.sources["stop_billed"].startswith("default"):
                profile = profiles[name] = self._probe_stop_billing(profile, items)
            if profile.sources["whitespace"] == "default":
                profiles[name] = self._probe_reasoning_end(profile, items)
        samples = [self._sample(item, profiles[item.reply.provider], where) for item in pending]
        return Rebuilt(samples, profiles, evidence)

    def _probe_stop_billing(self, profile: EngineProfile, items: list[_Pending]) -> EngineProfile:
        """With nothing known, the stop token's billing is read off the bills: on up to `PROBE_REPLIES`
        stopped text-only replies, the assumption under which at least twice as many fit wins (billed on
        a tie)."""
        probe = [
            item
            for item in items
            if item.exact is None and not item.reply.truncated and item.reply.billed_completion is not None
        ][:PROBE_REPLIES]
        fits = {billed: 0 for billed in (True, False)}
        for item in probe:
            item.pieces = PieceCache(self.chat)
            variants = self._variants(item, profile, item.pieces)
            for billed in fits:
                fits[billed] += select(variants, item.reply.billed_completion, billed).method in FITTING
        if fits[False] >= max(2 * fits[True], 1):
            return replace(profile, stop_billed=False, sources={**profile.sources, "stop_billed": "bills"})
        if fits[True] >= max(2 * fits[False], 1):
            return replace(profile, sources={**profile.sources, "stop_billed": "bills"})
        return profile

    def _probe_reasoning_end(self, profile: EngineProfile, items: list[_Pending]) -> EngineProfile:
        """With nothing known, whether the engine strips the reasoning's end (vLLM's Kimi parser) is read off
        the bills too. On up to `PROBE_REPLIES` replies with reasoning closed by a marker, a stripping
        engine's text misses the bill on every reply whose reasoning ended in whitespace, and putting it
        back fits; an engine that keeps the text misses only where the model split a token as BPE would
        not, which a restored whitespace token can also "fit". So `rstrip` is taken when the restoration
        alone fits at least `RSTRIP_RESCUED` of the probed replies (docs/tokens.md: the shares measured
        on both kinds of text)."""
        probe = [
            item
            for item in items
            if item.exact is None
            and item.reply.thinking
            and (item.reply.content or item.reply.tool_calls)
            and item.reply.billed_completion is not None
        ][:PROBE_REPLIES]
        stripping = replace(profile, whitespace=("rstrip",))
        rescued = 0
        for item in probe:
            pieces = item.pieces = item.pieces or PieceCache(self.chat)
            billed = item.reply.billed_completion
            if select(self._variants(item, profile, pieces), billed, profile.stop_billed).method in FITTING:
                continue
            fits = select(self._variants(item, stripping, pieces), billed, profile.stop_billed).method
            rescued += fits in FITTING
        if rescued >= max(RSTRIP_RESCUED * len(probe), 3):
            return replace(stripping, fallback=(), sources={**profile.sources, "whitespace": "bills"})
        return profile

    def _variants(self, item: _Pending, profile: EngineProfile, pieces: PieceCache) -> list[Variant]:
        return self.shape.variants(item.reply, self.chat, profile, item.history, pieces)

    def _select(
        self, item: _Pending, profile: EngineProfile, pieces: PieceCache, billed: int | None
    ) -> Selection:
        """The profile's reading, unless a fallback reading (one a minority of the provider's replies
        support) is in play: first when this reply's own text shows it, last when the profile's readings
        miss the bill. Then the reading the bill supports, flagged `whitespace`."""
        chosen = select(self._variants(item, profile, pieces), billed, profile.stop_billed)
        shown = tuple(r for r in profile.fallback if r == "pad" and item.padding == (1, 0))
        missed = chosen.method is Method.REBUILT_OFF_BY_K
        if not shown and not (missed and profile.fallback):
            return chosen
        readings = (*shown, *profile.whitespace) if shown else (*profile.whitespace, *profile.fallback)
        widened = replace(profile, whitespace=readings, fallback=())
        fitting = select(self._variants(item, widened, pieces), billed, profile.stop_billed)
        if fitting.method is Method.REBUILT_OFF_BY_K:
            return chosen
        flags = fitting.flags | Flag.WHITESPACE
        return replace(fitting, method=Method.REBUILT_AMBIGUOUS, flags=flags)

    def _first_pass(self, prompts: dict[str, PromptRecord], record: ResponseRecord, where: str) -> _Pending:
        reply = parse_reply(record, where)
        prompt = prompts.get(reply.prompt_id)
        if prompt is None:
            raise TokensError(
                f"{where}: prompt id {reply.prompt_id} is not in the prompt set; the responses "
                "are stale: rerun generation"
            )
        reply = self._as_generated(reply.text_only() if self.text_only else reply, record, where)
        history = tool_history(prompt["messages"])
        rejected = False
        for kind in (Method.SERVER_IDS, Method.LOGPROB_BYTES):
            ids: Sequence[int] | None
            if kind is Method.SERVER_IDS:
                if reply.server_ids is None:
                    continue
                ids = reply.server_ids
            else:
                if not reply.logprob_bytes:
                    continue
                # Bytes that name no token are refused too: vLLM sends a token that is part of a character
                # as what decoding it alone made of it (empty, or U+FFFD), not its own bytes.
                ids = ids_from_bytes(self.chat, reply.logprob_bytes)
            exact = (
                None
                if ids is None
                else exact_completion(self.chat, reply, ids, history, self.shape.whitespace)
            )
            if exact is not None:
                return _Pending(prompt, reply, history, exact, kind, False)
            rejected = True
        return _Pending(prompt, reply, history, None, None, rejected)

    def _as_generated(self, reply: Reply, record: ResponseRecord, where: str) -> Reply:
        """The reply in the parts the target generated: a template's answer is one text (tool calls
        rendered into it) and cannot reason; Kimi's parts are the reply's own."""
        calls = record["response"].get("tool_calls") or None
        text = self.chat.one_text_answer(reply.content, calls)
        if text is None:
            return reply
        if reply.reasoning:
            raise TokensError(
                f"{where}: prompt {reply.prompt_id}: the reply carries reasoning, which this target's "
                "template cannot hold; generate without reasoning (generation.reasoning: {enabled: false})"
            )
        return replace(reply, content=text, tool_calls=(), thinking=False)

    def _gather(self, evidence: Evidence, item: _Pending) -> None:
        evidence.samples += 1
        sites, refuted = item.padding  # (0, 0) for one text: no marker stands next to it
        evidence.pad_sites += sites
        evidence.pad_refuted += refuted
        if item.history and item.reply.tool_calls:
            number = item.reply.tool_calls[0].id.rsplit(":", 1)[-1]
            kind = {str(item.history): "conventional", str(2 * item.history): "shifted"}.get(number)
            evidence.first_call_numbers.update([kind] if kind else [])
        if item.exact is None:
            return
        seen = item.exact.observation
        evidence.exact_samples += 1
        evidence.exact_whitespace.update(seen.whitespace)
        for votes, value in (
            (evidence.stop_billed, seen.stop_billed),
            (evidence.renumbered, seen.renumbered),
            (evidence.trimmed, seen.trimmed),
        ):
            if value is not None:
                votes[value] += 1

    def _sample(self, item: _Pending, profile: EngineProfile, where: str) -> RebuiltSample:
        reply, chat = item.reply, self.chat
        prompt_ids, prompt_diffs, prompt_flags = self._prompt(item, where)
        server_prompt = None
        if reply.server_prompt_ids is not None:
            # The server's prompt is what the model was conditioned on: trained on when it differs.
            server_prompt = ServerPrompt(
                first_difference(prompt_ids, reply.server_prompt_ids),
                len(reply.server_prompt_ids),
                len(prompt_ids),
            )
            if server_prompt.first_difference is not None:
                prompt_ids = list(reply.server_prompt_ids)
                prompt_flags |= Flag.PROMPT_SERVER_IDS_MISMATCH
        pieces, item.pieces = item.pieces or PieceCache(chat), None
        flags = prompt_flags | (Flag.TRUNCATED if reply.truncated else Flag(0))
        flags |= Flag.SERVER_IDS_REJECTED if item.rejected else Flag(0)
        billed = reply.billed_completion
        stop_unbilled = int(not reply.truncated and not profile.stop_billed)
        if item.exact is not None:
            assert item.exact_method is not None  # set with `exact`
            ids, method = item.exact.ids, item.exact_method
            diff = len(ids) - stop_unbilled - billed if billed is not None else 0
        else:
            chosen = self._select(item, profile, pieces, billed)
            ids, method, diff = chosen.ids, chosen.method, chosen.billed_diff
            flags |= chosen.flags
            if method is Method.REBUILT_OFF_BY_K and self._only_split_differs(item, chosen, profile):
                method = Method.REBUILT_SEGMENTATION_ONLY
        as_returned = self._as_returned_length(reply, pieces) - stop_unbilled
        problem = structure_problem(
            chat, prompt_ids, ids, truncated=reply.truncated, thinking=reply.thinking
        )
        if problem is None and reply.thinking and not reply.reasoning and reply.reasoning_tokens:
            problem = "reasoning_not_returned"
        return RebuiltSample(
            reply.prompt_id,
            reply.provider,
            prompt_ids,
            ids,
            method,
            flags,
            reply.billed_prompt,
            billed,
            diff,
            as_returned - billed if billed is not None else None,
            prompt_diffs,
            problem,
            server_prompt,
            None if reply.server_ids is None else with_stop(chat, reply.server_ids, reply.truncated),
        )

    def _only_split_differs(self, item: _Pending, chosen: Selection, profile: EngineProfile) -> bool:
        """A reply that misses its bill can have lost structure (whitespace an engine ate at a marker, a
        special token dropped from the text, a cut tool call) or been split into tokens otherwise than BPE
        would split its text. Only the split can differ when the structure has one reading (`doubts`), no
        special token's text stands in the reply (an engine drops or mis-splits those), no tool call was
        cut, the server's own ids, if it sent any, did not contradict the text, and, for a reply with tool
        calls, the provider is known to keep arguments as generated: both vLLM and SGLang trim them, which
        leaves nothing in the text (docs/tokens.md). And the miss must be one splits make: a token or two
        per place, a few places per hundred tokens; a parser that dropped a tool section it could not read
        leaves hundreds of tokens unaccounted for."""
        reply = item.reply
        arguments_known = profile.sources.get("arguments") in KNOWN_SOURCES and profile.arguments == "keep"
        return not (
            abs(chosen.billed_diff) > SPLIT_MISS_FLOOR + SPLIT_MISS_SHARE * len(chosen.ids)
            or chosen.doubts
            or item.rejected
            or (reply.tool_calls and (reply.truncated or not arguments_known))
            or any(marker_text(self.chat).search(text) for text in reply.texts if text)
        )

    def _prompt(self, item: _Pending, where: str) -> tuple[list[int], dict[str, int], Flag]:
        """The configured tool-declaration format, unless only the other one gives the billed length; both
        lengths are recorded against the bill for prompts with tools."""
        prompt, reply = item.prompt, item.reply
        tools = prompt.get("tools")
        configured = self.settings.tool_format
        chat_format = self.chat
        others = [f for f in chat_format.tool_formats if f != configured] if tools else []
        ids, used, failures = None, configured, []
        for used in (configured, *others):
            try:
                ids = self._render(prompt, reply, used)
                break
            except RenderError as error:
                failures.append(str(error))
        if ids is None:
            raise TokensError(f"{where}: prompt {reply.prompt_id}: {failures[0]}")
        lengths = {used: len(ids)}
        if tools and others:  # (others are only looked for with tools)
            lengths |= chat_format.other_tool_format_lengths(tools, used, len(ids))
        billed = reply.billed_prompt
        flags = Flag(0)
        if billed is not None and len(ids) != billed:
            matching = [f for f, length in lengths.items() if length == billed]
            if matching:
                ids, flags = self._render(prompt, reply, matching[0]), Flag.PROMPT_OTHER_TOOL_FORMAT
            else:
                flags = Flag.PROMPT_COUNT_MISMATCH
        if not tools or billed is None:
            return ids, {}, flags
        return ids, {chat_format.tool_format_name(f): length - billed for f, length in lengths.items()}, flags

    def _render(self, prompt: PromptRecord, reply: Reply, tool_format: ToolFormat) -> list[int]:
        return self.chat.prompt_ids(
            prompt["messages"], prompt.get("tools"), thinking=reply.thinking, tool_format=tool_format
        )

    def _as_returned_length(self, reply: Reply, pieces: PieceCache) -> int:
        """The completion's length for the returned text taken as is (the shared renderer's structure)."""
        calls: list[ToolCall] = [
            {"id": c.id, "function": {"name": c.name, "arguments": c.arguments}} for c in reply.tool_calls
        ]
        segments = self.chat.completion_segments(
            reasoning=reply.reasoning,
            content=reply.content,
            tool_calls=calls,
            truncated=reply.truncated,
            thinking=reply.thinking,
        )
        return sum(1 if isinstance(s, Special) else len(pieces(s.text).ids) for s in segments)


def first_difference(ours: Sequence[int], theirs: Sequence[int]) -> int | None:
    """The first position where two id lists differ (the shorter one's length if one starts the other), or
    None when they are the same."""
    if list(ours) == list(theirs):
        return None
    pairs = enumerate(zip(ours, theirs, strict=False))
    return next((i for i, (a, b) in pairs if a != b), min(len(ours), len(theirs)))


def pad_signature(reply: Reply) -> tuple[int, int]:
    """(1 if the reply has text next to a marker, 1 if that text lacks a padding engine's space) for the
    reply's usual structure."""
    think_end = reply.thinking and bool(reply.content or reply.tool_calls)
    section = bool(reply.tool_calls)
    edits = [unpad_edit(reply.content, think_end, section)] if think_end or not reply.thinking else []
    if reply.thinking:
        edits.append(unpad_edit(reply.reasoning, False, think_end or section))
    if any(edit is None for edit in edits):
        return 1, 1
    return int(any(edit != NO_EDIT for edit in edits)), 0
