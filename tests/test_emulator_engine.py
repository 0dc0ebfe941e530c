"""The batching engine with the real model, in-process: failures, cancellation, per-row settings."""

from __future__ import annotations

import asyncio

import pytest

from eaglepipe.emulator.engine import Engine, GenerationFailed, GenerationRequest
from eaglepipe.target.chat import render_prompt_ids, stop_token_id
from eaglepipe.target.load import load_target, load_tokenizer

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def loaded(model_dir):
    return load_target(model_dir), load_tokenizer(model_dir)


@pytest.fixture
def engine(loaded):
    model, tokenizer = loaded
    engine = Engine(model, stop_token_id(tokenizer), tokenizer.pad_token_id, max_batch=4, gather_s=0.05)
    engine.start()
    yield engine
    engine.close()


def prompt(loaded, text: str) -> list[int]:
    return render_prompt_ids(loaded[1], [{"role": "user", "content": text}])


async def collect(engine: Engine, request: GenerationRequest, keep: int | None = None) -> list[int]:
    ids = []
    async for token in engine.stream(request):
        ids.append(token.token_id)
        if keep is not None and len(ids) == keep:
            break
    return ids


def test_rows_keep_their_own_limits_and_a_cancelled_row_frees_the_batch(engine, loaded):
    ids = prompt(loaded, "Say hi.")

    async def run():
        return await asyncio.gather(
            collect(engine, GenerationRequest(ids, max_tokens=6, temperature=0)),
            collect(engine, GenerationRequest(ids, max_tokens=3, temperature=0)),
            collect(engine, GenerationRequest(ids, max_tokens=20, temperature=0), keep=2),
        )

    six, three, cancelled = asyncio.run(run())
    assert engine.largest_batch == 3
    assert len(six) == 6 and three == six[:3] and cancelled == six[:2]


def test_stop_token_ends_a_row(engine, loaded):
    ids = asyncio.run(
        collect(
            engine,
            GenerationRequest(
                prompt(loaded, "Reply with one word: yes or no. Is fire hot?"), max_tokens=20, temperature=0
            ),
        )
    )
    assert ids[-1] == engine.stop_id and engine.stop_id not in ids[:-1]


def test_a_failed_batch_fails_its_requests_and_the_engine_serves_on(engine, loaded):
    vocab = loaded[0].config.vocab_size
    with pytest.raises(GenerationFailed, match="generation failed"):
        asyncio.run(collect(engine, GenerationRequest([vocab + 5], max_tokens=2, temperature=0)))
    assert len(asyncio.run(collect(engine, GenerationRequest(prompt(loaded, "Hi"), max_tokens=2)))) == 2


def test_logprobs_are_normalised_and_ranked(engine, loaded):
    async def run():
        return [
            t
            async for t in engine.stream(
                GenerationRequest(prompt(loaded, "Hi"), max_tokens=3, temperature=0, top_logprobs=3)
            )
        ]

    for token in asyncio.run(run()):
        assert token.top[0] == (token.token_id, pytest.approx(token.logprob))
        assert [lp for _, lp in token.top] == sorted((lp for _, lp in token.top), reverse=True)
        assert token.logprob <= 0


def test_a_closed_engine_refuses_work(loaded):
    model, tokenizer = loaded
    engine = Engine(model, stop_token_id(tokenizer), tokenizer.pad_token_id)
    engine.start()
    engine.close()
    with pytest.raises(GenerationFailed, match="shutting down"):
        asyncio.run(collect(engine, GenerationRequest([1, 2, 3], max_tokens=1)))
