"""Can the model's own split of its text be recovered from the bill? For every answer the token stage labels
segmentation-only (its canonical ids miss the bill, only the split can differ), this tries the cheapest
guesses that reach the billed count, one extra token per missing one, each a canonical token split into
two vocabulary tokens that spell it, ranked three ways, and measures each against the true ids: how often
the guess is the truth, and its edit distance to the truth beside the canonical ids'.

    .venv/bin/python bench/resplit.py TARGET_DIR PROMPTS.jsonl RESPONSES.jsonl [RESPONSES.jsonl ...]

RESPONSES must carry the true ids (`response.token_ids`: bench/round_trip.py --keep leaves such files).
Rankings: `latest merge` splits the token with the highest id (in byte-level BPE vocabularies ids follow
merge order, so the highest is the merge the model most plausibly did not take), `longest` the token with
the most bytes, `first` the first splittable token.
"""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path
from typing import Any

from eaglepipe.prompts.records import read_prompt_set
from eaglepipe.responses import read_responses
from eaglepipe.target.chat_format import chat_format_for
from eaglepipe.target.load import load_target_tokenizer
from eaglepipe.tokens.methods import Method
from eaglepipe.tokens.rebuild import Rebuilder, TokenSettings

SETTINGS = TokenSettings(
    on_mismatch="drop", on_ambiguous="keep", on_segmentation="keep", tool_format="typescript", providers={}
)


def edit_distance(a: list[int], b: list[int]) -> int:
    previous = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        current = [i]
        for j, y in enumerate(b, 1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (x != y)))
        previous = current
    return previous[-1]


def splits(token_bytes: dict[int, bytes], ids_of: dict[bytes, int], token: int) -> list[tuple[int, int]]:
    spelled = token_bytes[token]
    return [
        (ids_of[spelled[:cut]], ids_of[spelled[cut:]])
        for cut in range(1, len(spelled))
        if spelled[:cut] in ids_of and spelled[cut:] in ids_of
    ]


def guess(
    ids: list[int],
    missing: int,
    rank: str,
    token_bytes: dict[int, bytes],
    ids_of: dict[bytes, int],
    specials: set[int],
) -> list[int] | None:
    """`ids` with `missing` tokens each split in two, the ranking's choice first; None if none splits."""
    out = list(ids)
    for _ in range(missing):
        options = [(p, t) for p, t in enumerate(out) if t not in specials and splits(token_bytes, ids_of, t)]
        if not options:
            return None
        if rank == "latest merge":
            position, token = max(options, key=lambda o: o[1])
        elif rank == "longest":
            position, token = max(options, key=lambda o: len(token_bytes[o[1]]))
        else:
            position, token = options[0]
        out[position : position + 1] = list(splits(token_bytes, ids_of, token)[0])
    return out


def main() -> None:
    target, prompts_path, *responses = map(Path, sys.argv[1:])
    chat = chat_format_for(load_target_tokenizer(target))
    tokenizer = chat.tokenizer
    token_bytes = {
        i: tokenizer.token_bytes(i) for i in range(tokenizer.vocab_size) if not tokenizer.is_special(i)
    }
    ids_of = {b: i for i, b in sorted(token_bytes.items(), reverse=True)}
    specials = set(chat.special_ids)
    prompts = {p["id"]: p for p in read_prompt_set(prompts_path)}
    tally: Counter[str] = Counter()
    for path in responses:
        records = read_responses(path)
        text_only = [
            {**r, "response": {k: v for k, v in r["response"].items() if k != "token_ids"}} for r in records
        ]
        rebuilt = Rebuilder(chat, SETTINGS).rebuild(prompts, text_only, str(path))
        for sample, record in zip(rebuilt.samples, records, strict=True):
            if sample.method is not Method.REBUILT_SEGMENTATION_ONLY or sample.billed_diff >= 0:
                continue
            stopped = record["response"]["finish_reason"] != "length"
            truth: list[Any] = record["response"]["token_ids"] + ([chat.layout.stop] if stopped else [])
            tally["answers"] += 1
            tally["canonical distance"] += edit_distance(sample.completion_ids, truth)
            for rank in ("latest merge", "longest", "first"):
                guessed = guess(
                    sample.completion_ids, -sample.billed_diff, rank, token_bytes, ids_of, specials
                )
                guessed = guessed or sample.completion_ids
                tally[f"{rank} exact"] += guessed == truth
                tally[f"{rank} distance"] += edit_distance(guessed, truth)
    answers = tally["answers"] or 1
    print(f"{tally['answers']} segmentation-only answers with fewer ids than billed")
    print(f"{'ids':14} {'equal to truth':>14} {'mean edit distance':>18}")
    print(f"{'canonical':14} {0:>14} {tally['canonical distance'] / answers:>18.2f}")
    for rank in ("latest merge", "longest", "first"):
        print(f"{rank:14} {tally[rank + ' exact']:>14} {tally[rank + ' distance'] / answers:>18.2f}")


if __name__ == "__main__":
    main()
