"""The round-trip gate and the server's prompt ids, end to end: the emulator serving SmolLM2 answers with
their ids (`return_token_ids`) under a text-like switch, the generation client journals them, and the token
stage rebuilds every answer from its text alone next to the server's ids it trains on."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from stage_settings import generation_settings, token_settings

from eaglepipe.answers.asked import generate_responses
from eaglepipe.emulator.runner import running_emulator
from eaglepipe.openrouter.fingerprint import request_fingerprint
from eaglepipe.tokens.build import build_tokens

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parent.parent
MODEL = "local/smollm2-135m-instruct"
PER_SOURCE = 5
SET_SIZE = 24
MAX_TOKENS = 48


def demo_prompts() -> list[dict[str, Any]]:
    """The first prompts of each demo source (chat, code, math, multi-turn, tools)."""
    prompts = []
    for path in sorted((REPO / "resources" / "sources" / "demo").glob("*.jsonl")):
        for number, line in enumerate(path.read_text().splitlines()[:PER_SOURCE]):
            prompts.append({"id": f"{path.stem}-{number}", **json.loads(line)})
    return prompts[:SET_SIZE]


def answered_set(folder: Path, model_dir: Path, text_like: str, stream: bool) -> dict[str, Any]:
    """Generate the set through the emulator with `--text-like text_like`, then run the token stage."""
    prompts = demo_prompts()
    prompts_path = folder / "prompts.jsonl"
    prompts_path.write_text("".join(json.dumps(p) + "\n" for p in prompts))
    sampling = {"temperature": 0.0, "top_p": 1.0, "seed": 0}
    with running_emulator(model_dir, extra_args=["--text-like", text_like, "--max-batch", "24"]) as base_url:
        settings = generation_settings(
            base_url=base_url,
            model=MODEL,
            max_tokens=MAX_TOKENS,
            sampling=sampling,
            provider_obj=None,
            concurrency=SET_SIZE,
            return_token_ids=True,
            stream=stream,
            fingerprint=request_fingerprint(MODEL, "emulator", None, sampling, MAX_TOKENS, None),
        )
        summary = generate_responses(
            prompts_path,
            folder / "responses.jsonl",
            folder / "summary.json",
            folder / ".journal",
            folder / ".ledger",
            folder.name,
            settings,
            None,
        )
    assert summary.done == len(prompts)
    return build_tokens(
        prompts_path,
        folder / "responses.jsonl",
        model_dir,
        folder / "tokens.safetensors",
        folder / "tokens.json",
        token_settings(),
    )


# The served switch gives the text; the ids come whenever the request asks (`vllm` with ids: `vllm_ids`).
@pytest.fixture(scope="module", params=[("vllm", False), ("exact", True)], ids=["vllm_ids", "exact-streamed"])
def answered(request, tmp_path_factory, model_dir):
    text_like, stream = request.param
    return answered_set(tmp_path_factory.mktemp(text_like), model_dir, text_like, stream)


def test_every_answer_with_server_ids_goes_through_the_gate(answered):
    gate, responses = answered["round_trip"], answered["counts"]["responses"]
    assert gate["samples"] == gate["exact"] + gate["count_matched"] + gate["off"] == responses
    assert answered["counts"]["by_method"]["server_ids"] == responses  # the server's ids are trained on
    assert len(gate["misses"]) == gate["count_matched"] + gate["off"]
    for miss in gate["misses"]:
        same_length = miss["server_length"] == miss["rebuilt_length"]
        assert miss["kind"] == ("count_matched" if same_length else "off")
        assert 0 <= miss["first_difference"] <= min(miss["server_length"], miss["rebuilt_length"])
    assert gate["exact"] >= responses // 2


def test_the_servers_prompt_ids_match_our_rendering(answered):
    server_ids = answered["prompt"]["server_ids"]
    assert server_ids == {
        "samples": answered["counts"]["responses"],
        "matched": answered["counts"]["responses"],
        "mismatched": 0,
        "mismatches": [],
    }
    assert "prompt_server_ids_mismatch" not in answered["counts"]["flags"]
