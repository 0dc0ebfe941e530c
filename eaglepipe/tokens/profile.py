"""What each provider's engine does to the text, decided per provider before any sample is rebuilt.

Each field comes from the first source that knows it: the config (`tokens.providers.NAME`), the provider's
own samples that carry exact ids (server ids or logprob bytes show exactly what was changed), the text of
its samples (padding leaves a space at every marker of a reply; SGLang's renumbering counts the earlier
calls twice in the first call's number), the bills (the stop token's billing, vLLM's stripped reasoning
end: `rstrip`, decided in `rebuild.py`), else the default: the engine returns the text as generated and
bills the stop token (vLLM does). Stripping both ends and trimming cannot be seen in text (they leave
nothing), so they are known only from the config or from exact ids.

Text is weighed, not vetoed: the provider pads when most of its replies with a marker next to text show the
padding space. A provider behind one name may run more than one engine, or answer some requests another
way, so the replies that refute the majority keep the other reading as a fallback (`fallback`), taken for
a reply only when the profile's readings miss its bill and the fallback fits it, and then flagged.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from eaglepipe.config_types import ProviderHabits
from eaglepipe.tokens.normalize import WHITESPACE_MODES
from eaglepipe.tokens.token_file import EngineSummary, EvidenceSummary

# A provider is taken to pad only when at least this many samples had a space at every marker; with fewer,
# the text as returned stays a candidate too.
PAD_EVIDENCE = 3
# Replies whose first call is numbered after the earlier calls twice that make a provider SGLang-like.
SHIFT_EVIDENCE = 3


@dataclass(frozen=True)
class ProviderPin:
    """What the config says about one provider's engine; None: find out."""

    whitespace: str | None = None
    tool_ids: str | None = None
    arguments: str | None = None
    stop_billed: bool | None = None

    @classmethod
    def from_config(cls, entry: ProviderHabits) -> ProviderPin:
        return cls(
            entry.get("whitespace"), entry.get("tool_ids"), entry.get("arguments"), entry.get("stop_billed")
        )


@dataclass(frozen=True)
class EngineProfile:
    """`whitespace`: the readings to try, preferred first; `fallback`: readings some of the provider's
    replies support against the majority; `sources`: where each field was decided."""

    whitespace: tuple[str, ...] = ("keep",)
    fallback: tuple[str, ...] = ()
    tool_ids: str = "keep"
    arguments: str = "keep"
    stop_billed: bool = True
    sources: dict[str, str] = field(default_factory=dict)

    def summary(self) -> EngineSummary:
        return {
            "whitespace": list(self.whitespace),
            "whitespace_fallback": list(self.fallback),
            "tool_ids": self.tool_ids,
            "arguments": self.arguments,
            "stop_billed": self.stop_billed,
            "decided_by": dict(self.sources),
        }


@dataclass
class Evidence:
    """What one provider's samples showed, gathered in a first pass over the responses."""

    samples: int = 0
    pad_sites: int = 0  # samples with a marker next to text, where padding leaves a space
    pad_refuted: int = 0  # of those, samples whose text lacks such a space
    exact_whitespace: Counter[str] = field(default_factory=Counter)  # modes consistent with exact-id samples
    exact_samples: int = 0
    stop_billed: Counter[bool] = field(default_factory=Counter)
    renumbered: Counter[bool] = field(default_factory=Counter)
    trimmed: Counter[bool] = field(default_factory=Counter)
    # Replies after earlier calls whose first call is numbered after them (`conventional`: Kimi's own
    # numbering, kept) or after them twice (`shifted`: SGLang's non-streamed renumbering of it).
    first_call_numbers: Counter[str] = field(default_factory=Counter)

    def summary(self) -> EvidenceSummary:
        return {
            "samples": self.samples,
            "pad_sites": self.pad_sites,
            "pad_refuted": self.pad_refuted,
            "exact_id_samples": self.exact_samples,
        }


def decide_profile(evidence: Evidence, pin: ProviderPin) -> EngineProfile:
    sources: dict[str, str] = {}
    whitespace, fallback = _whitespace(evidence, pin, sources)
    stop_billed = _choice(pin.stop_billed, evidence.stop_billed, True, "stop_billed", sources)
    renumber = _choice(_is(pin.tool_ids, "renumber"), evidence.renumbered, False, "tool_ids", sources)
    shifted, conventional = (evidence.first_call_numbers[k] for k in ("shifted", "conventional"))
    if sources["tool_ids"] == "default" and shifted >= SHIFT_EVIDENCE and shifted > conventional:
        renumber, sources["tool_ids"] = True, "text"
    trim = _choice(_is(pin.arguments, "trim"), evidence.trimmed, False, "arguments", sources)
    return EngineProfile(
        whitespace,
        fallback,
        "renumber" if renumber else "keep",
        "trim" if trim else "keep",
        stop_billed,
        sources,
    )


def _is(value: str | None, wanted: str) -> bool | None:
    return None if value is None else value == wanted


def _choice(
    pinned: bool | None, votes: Counter[bool], default: bool, name: str, sources: dict[str, str]
) -> bool:
    """The config's value, else what exact-id samples showed (all of them agreeing), else the default."""
    if pinned is not None:
        sources[name] = "config"
        return pinned
    if len(votes) == 1:
        sources[name] = "exact_ids"
        return next(iter(votes))
    sources[name] = "default" if not votes else "default (exact ids disagree)"
    return default


def _whitespace(
    evidence: Evidence, pin: ProviderPin, sources: dict[str, str]
) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(readings, fallback readings) for the provider's whitespace."""
    if pin.whitespace is not None:
        sources["whitespace"] = "config"
        return (pin.whitespace,), ()
    consistent = [m for m in WHITESPACE_MODES if evidence.exact_whitespace[m] == evidence.exact_samples]
    if evidence.exact_samples and len(consistent) == 1:
        sources["whitespace"] = "exact_ids"
        return (consistent[0],), ()
    padded = evidence.pad_sites - evidence.pad_refuted
    if padded > evidence.pad_refuted and (not evidence.exact_samples or "pad" in consistent):
        sources["whitespace"] = "text"
        readings = ("pad",) if padded >= PAD_EVIDENCE else ("pad", "keep")
        return readings, ("keep",) if evidence.pad_refuted and "keep" not in readings else ()
    sources["whitespace"] = "default"
    return ("keep",), ("pad",) if padded and (not evidence.exact_samples or "pad" in consistent) else ()
