"""The token stage against the engines' own code: the synthetic Kimi corpus's true ids through vLLM's
detokenizer and Kimi parsers and SGLang's detokenizer and Kimi parsers (tests/support/engines), streamed
and not, then rebuilt from the text they return, the ids vLLM returns, or vLLM's logprob entries."""

from __future__ import annotations

import re

import pytest
from stage_settings import token_settings
from support.emulator.kimi_synthetic import TrueSample, bytes_of_characters, kimi_corpus
from support.engines.corpus import MODES, engine_corpus, engine_record

from eaglepipe.emulator.text_like import SWITCHES, engine_reply
from eaglepipe.target.chat_format import chat_format_for
from eaglepipe.tokens.methods import EXACT_METHODS, Flag, Method
from eaglepipe.tokens.profile import ProviderPin
from eaglepipe.tokens.rebuild import Rebuilder

pytestmark = [pytest.mark.slow, pytest.mark.vllm, pytest.mark.sglang]
CORPUS_SIZE = 200
ENGINES = ("vllm", "sglang")


@pytest.fixture(scope="module")
def corpus(kimi) -> list[TrueSample]:
    return kimi_corpus(kimi, CORPUS_SIZE)


@pytest.fixture(scope="module")
def replies(kimi, kimi_dir, corpus, tmp_path_factory) -> dict[tuple[str, str], list[dict]]:
    """(engine, mode) -> the engine's reply to each corpus sample, in corpus order."""
    lines = engine_corpus(kimi, kimi_dir, corpus, tmp_path_factory.mktemp("engines"), list(ENGINES))
    by_key = {(line["engine"], line["mode"], line["key"]): line for line in lines}
    return {
        (engine, mode): [by_key[engine, mode, s.prompt["id"]] for s in corpus]
        for engine in ENGINES
        for mode in MODES
    }


# What a config that names each engine says (`tokens.providers`): vLLM's parser strips the reasoning's end,
# trims arguments and keeps ids; SGLang's trims arguments and renumbers ids. Written out rather than taken
# from text_like.pin_for: this file checks text_like against the engines, so it does not lean on it.
PINS = {
    "vllm": ProviderPin("rstrip", "keep", "trim", True),
    "sglang": ProviderPin("keep", "renumber", "trim", True),
}


@pytest.fixture(scope="module")
def spelled(kimi, corpus) -> list[TrueSample]:
    """The corpus's samples with non-ASCII text, those tokens spelled byte by byte (parts of characters)."""
    return bytes_of_characters(kimi, corpus)


@pytest.fixture(scope="module")
def spelled_replies(kimi, kimi_dir, spelled, tmp_path_factory) -> dict[str, list[dict]]:
    """mode -> vLLM's reply to each spelled sample (the only engine side that returns logprobs)."""
    lines = engine_corpus(kimi, kimi_dir, spelled, tmp_path_factory.mktemp("spelled"), ["vllm"])
    by_key = {(line["mode"], line["key"]): line for line in lines}
    return {mode: [by_key[mode, s.prompt["id"]] for s in spelled] for mode in MODES}


def rebuild(kimi, corpus, replies, *, with_ids=False, with_logprobs=False, informed=False):
    records = [
        engine_record(s, r, with_ids=with_ids, with_logprobs=with_logprobs)
        for s, r in zip(corpus, replies, strict=True)
    ]
    prompts = {s.prompt["id"]: s.prompt for s in corpus}
    pins = {records[0]["provider"]: PINS[replies[0]["engine"]]} if informed else {}
    rebuilder = Rebuilder(chat_format_for(kimi), token_settings(pins=pins))
    return rebuilder.rebuild(prompts, records, "engines").samples


def test_both_engines_answer_every_sample_in_both_modes(replies, corpus):
    for (engine, mode), lines in replies.items():
        assert len(lines) == len(corpus), (engine, mode)
        assert sum(1 for line in lines if line["tool_calls"]) > CORPUS_SIZE // 10, (engine, mode)


def test_no_sample_labelled_exact_differs_from_the_truth(kimi, corpus, replies):
    for (engine, mode), lines in replies.items():
        samples = rebuild(kimi, corpus, lines, with_ids=True)
        exact = [(s, t) for s, t in zip(samples, corpus, strict=True) if s.method in EXACT_METHODS]
        assert len(exact) > CORPUS_SIZE // 2, (engine, mode)
        for sample, truth in exact:
            assert sample.completion_ids == truth.ids, (engine, mode, sample.prompt_id)


SPELLED_SPECIAL = re.compile(r"<\|[a-z_]+\|>|\[(?:BOS|EOS|EOT|UNK|PAD)\]|</?think>")
# What each engine and mode does to Kimi-K2.5's text, as the engines' own code showed it (docs/tokens.md).
HABITS = {
    ("vllm", "whole"): {
        "reasoning: trailing whitespace stripped",
        "reasoning: special spellings dropped",
        "content: special spellings dropped",
        "content: text spelling a special token misread",
        "content: whitespace only dropped",
        "arguments: trimmed",
        "tool calls: the call cut off by the length limit returned",
    },
    ("vllm", "stream"): {
        "reasoning: trailing whitespace stripped",
        "reasoning: text spelling a special token misread",
        "content: whitespace only dropped",
        "tool calls: the call cut off by the length limit returned",
    },
    ("sglang", "whole"): {
        "tool id: renumbered after earlier calls",
        "arguments: trimmed",
        "reasoning: text spelling a special token misread",
        "content: text spelling a special token misread",
    },
    ("sglang", "stream"): {
        "tool id: renumbered after earlier calls",
        "arguments: trimmed",
        "content: whitespace after arguments appended",
        "content: text spelling a special token misread",
        "tool calls: the call cut off by the length limit returned",
    },
}


def habits(sample: TrueSample, reply: dict, kimi) -> set[str]:
    """How `reply` differs from the text the model generated, each difference named."""
    exact = engine_reply(
        kimi,
        sample.answer_ids,
        SWITCHES["exact"],
        stopped=sample.stopped,
        thinking=sample.thinking,
        tool_history=sample.tool_history,
    )
    found = set()
    spelled = bool(SPELLED_SPECIAL.search((exact.reasoning or "") + exact.content))
    for part, got, want in (
        ("reasoning", reply["reasoning"], exact.reasoning),
        ("content", reply["content"], exact.content),
    ):
        part_habits = _text_habits(part, got or "", want or "")
        if spelled and f"{part}: unexplained" in part_habits:  # the parser split at a spelled marker
            part_habits = {f"{part}: text spelling a special token misread"}
        found |= part_habits
    calls = [(c["id"], c["function"]["arguments"]) for c in exact.tool_calls]
    returned = reply["tool_calls"]
    if len(returned) == len(calls) + 1 and not sample.stopped:
        found.add("tool calls: the call cut off by the length limit returned")
        returned = returned[:-1]
    if len(returned) != len(calls):
        return found | {"tool calls: unexplained count"}
    for position, (call, (model_id, arguments)) in enumerate(zip(returned, calls, strict=True)):
        name, number = model_id.rsplit(":", 1)
        renumbered = {
            f"{name}:{sample.tool_history + int(number)}",
            f"{name}:{sample.tool_history + position}",
        }
        if call["id"] != model_id:
            found.add(
                "tool id: renumbered after earlier calls"
                if call["id"] in renumbered
                else "tool id: unexplained"
            )
        if call["arguments"] != arguments:
            found.add(
                "arguments: trimmed" if call["arguments"] == arguments.strip() else "arguments: unexplained"
            )
    return found


def _text_habits(part: str, got: str, want: str) -> set[str]:
    if got == want:
        return set()
    found = set()
    unspelled = SPELLED_SPECIAL.sub("", want)
    if unspelled != want:
        if got == unspelled or got == unspelled.rstrip():
            found.add(f"{part}: special spellings dropped")
            want = unspelled
        else:
            return {f"{part}: text spelling a special token misread"}
    tail = got[len(want.lstrip()) :] if got.startswith(want.lstrip()) else None
    if got == want:
        pass
    elif not want.strip() and not got:
        found.add(f"{part}: whitespace only dropped")
    elif part == "reasoning" and got == want.rstrip():
        found.add("reasoning: trailing whitespace stripped")
    elif part == "content" and got.startswith(want) and not got[len(want) :].strip():
        found.add("content: whitespace after arguments appended")
    elif part == "content" and tail is not None and not tail.strip():
        found.add("content: leading whitespace dropped")
        if tail:
            found.add("content: whitespace after arguments appended")
    else:
        found.add(f"{part}: unexplained")
    return found


def test_every_change_an_engine_makes_is_a_known_habit(kimi, corpus, replies):
    """The habits table in docs/tokens.md, checked: each engine and mode does exactly these things."""
    for key, lines in replies.items():
        seen = set().union(*(habits(s, r, kimi) for s, r in zip(corpus, lines, strict=True)))
        assert seen == HABITS[key], key


def shares(samples, corpus) -> dict[str, float]:
    pairs = list(zip(samples, corpus, strict=True))
    counts = {
        "ids true": sum(s.completion_ids == t.ids for s, t in pairs),
        "count-matched wrong": sum(
            s.method is Method.REBUILT_COUNT_MATCHED and s.completion_ids != t.ids for s, t in pairs
        ),
        "ambiguous": sum(s.method is Method.REBUILT_AMBIGUOUS for s, _ in pairs),
        "off by k": sum(s.method is Method.REBUILT_OFF_BY_K for s, _ in pairs),
    }
    return {name: round(count / len(pairs), 3) for name, count in counts.items()}


def test_shares_from_text_per_engine_and_mode(kimi, corpus, replies, capsys):
    """The shares docs/tokens.md reports (printed); every text-only sample is rebuilt, none labelled exact."""
    for (engine, mode), lines in replies.items():
        for informed in (False, True):
            samples = rebuild(kimi, corpus, lines, informed=informed)
            assert not any(s.method in EXACT_METHODS for s in samples)
            with capsys.disabled():
                print(f"\n{engine} {mode} ({'informed' if informed else 'blind'}): {shares(samples, corpus)}")


def test_no_sample_labelled_logprob_bytes_differs_from_the_truth(
    kimi, corpus, replies, spelled, spelled_replies, capsys
):
    """vLLM's logprob entries (its LogprobsProcessor's decoded tokens, sent as `_create_chat_logprobs`
    sends them) give the corpus's ids exactly; a token that is part of a character comes back empty, so
    those samples are refused (flagged) and rebuilt from text. The shares docs/tokens.md reports (printed)."""
    assert len(spelled) > CORPUS_SIZE // 4
    for mode in MODES:
        for name, truths, lines in (
            ("corpus", corpus, replies["vllm", mode]),
            ("bytes of characters", spelled, spelled_replies[mode]),
        ):
            samples = rebuild(kimi, truths, lines, with_logprobs=True)
            labelled = [
                (s, t) for s, t in zip(samples, truths, strict=True) if s.method is Method.LOGPROB_BYTES
            ]
            for sample, truth in labelled:
                assert sample.completion_ids == truth.ids, (mode, name, sample.prompt_id)
            if name == "corpus":
                assert len(labelled) > CORPUS_SIZE // 2, mode
            else:
                assert not labelled and all(s.flags & Flag.SERVER_IDS_REJECTED for s in samples), mode
            with capsys.disabled():
                exact = round(len(labelled) / len(samples), 3)
                print(f"\nvllm {mode} logprobs, {name}: logprob_bytes {exact}, {shares(samples, truths)}")


def test_sglang_renumbered_ids_are_read_back_to_the_models_own(kimi, corpus, replies):
    """SGLang's non-streamed reply numbers a call after the conversation's earlier calls plus the model's
    own number; with the engine named in the config, the model's id comes back from it."""
    lines = replies["sglang", "whole"]
    samples = rebuild(kimi, corpus, lines, informed=True)
    renumbered = [
        (sample, truth)
        for sample, truth, reply in zip(samples, corpus, lines, strict=True)
        if habits(truth, reply, kimi) == {"tool id: renumbered after earlier calls"}
        and truth.hazards <= {"content_edge_whitespace", "reasoning_edge_whitespace"}  # SGLang keeps those
    ]
    assert len(renumbered) >= 5
    for sample, truth in renumbered:
        assert sample.completion_ids == truth.ids, sample.prompt_id


def test_vllms_stripped_reasoning_end_is_learned_from_the_bills(kimi, corpus, replies):
    """Nothing in vLLM's text shows that it stripped the reasoning's end; the bills do, and SGLang's don't."""
    prompts = {s.prompt["id"]: s.prompt for s in corpus}
    for (engine, mode), lines in replies.items():
        records = [engine_record(s, r) for s, r in zip(corpus, lines, strict=True)]
        rebuilt = Rebuilder(chat_format_for(kimi), token_settings()).rebuild(prompts, records, "engines")
        profile = rebuilt.profiles[f"{engine}-{mode}"]
        if engine == "vllm":
            assert (profile.whitespace, profile.sources["whitespace"]) == (("rstrip",), "bills"), mode
        else:
            assert profile.whitespace == ("keep",), mode


NOT_EMULATED = {
    "reasoning: special spellings dropped",
    "content: special spellings dropped",
    "reasoning: text spelling a special token misread",
    "content: text spelling a special token misread",
    "tool calls: the call cut off by the length limit returned",
}


@pytest.mark.parametrize("engine", ENGINES)
def test_the_emulators_switch_returns_what_the_engine_returns(kimi, corpus, replies, engine):
    """`text_like`'s `vllm` and `sglang` switches (the emulator's `--text-like`, the synthetic tests'
    engines) give each non-streamed reply exactly as the engine's own code does, but for the rare habits
    they leave out (NOT_EMULATED)."""
    compared = 0
    for sample, reply in zip(corpus, replies[engine, "whole"], strict=True):
        if habits(sample, reply, kimi) & NOT_EMULATED:
            continue
        emulated = engine_reply(
            kimi,
            sample.answer_ids,
            SWITCHES[engine],
            stopped=sample.stopped,
            thinking=sample.thinking,
            tool_history=sample.tool_history,
        )
        calls = [(c["id"], c["function"]["name"], c["function"]["arguments"]) for c in emulated.tool_calls]
        assert (emulated.reasoning or None, emulated.content, calls) == (
            reply["reasoning"] or None,
            reply["content"] or "",
            [(c["id"], c["name"], c["arguments"]) for c in reply["tool_calls"]],
        ), (engine, sample.prompt["id"])
        compared += 1
    assert compared > CORPUS_SIZE // 2
