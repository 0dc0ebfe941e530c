"""Run inside SGLang's environment (`make sglang-env`): known completion ids through SGLang's own code.

SGLang's detokenizer (`DetokenizerManager._decode_batch_token_id_output`, fed as its scheduler feeds it:
the prompt's last 5 ids first, then one step per id when streaming, every 50 ids and the finish when
not; a matched stop token trimmed) and its Kimi-K2 reasoning parser and function-call parser, streamed
and not. What joins them in the server (`serving_chat.py`, which needs FastAPI and a running server) is
restated here in a few lines, each naming the function it follows: reasoning forced unless the request
turns thinking off, tool calls only when the request has tools (which also turns `skip_special_tokens`
off), and ids renumbered `functions.NAME:{earlier calls + index}` where the index is the model's own
number when not streamed and a counter from 0 when streamed.

    PYTHONPATH=tests/sglang_cpu:tests:. .venv-sglang/bin/python tests/support/engines/sglang_side.py \\
        MODEL_DIR IN.jsonl OUT.jsonl
"""

from __future__ import annotations

import importlib
import json
import sys
import types
from types import SimpleNamespace
from typing import Any

from sglang.srt.entrypoints.openai.protocol import ChatCompletionRequest
from sglang.srt.function_call.function_call_parser import FunctionCallParser
from sglang.srt.parser.reasoning_parser import ReasoningParser
from transformers import AutoTokenizer  # before SGLang: its imports look for torchvision through transformers

from support.engines.replay import replay

PROMPT_OFFSET = 5  # schedule_batch.py: INIT_INCREMENTAL_DETOKENIZATION_OFFSET
NON_STREAM_INTERVAL = 50  # output_streamer.py: a non-streamed request's ids reach the detokenizer this often
# Modules the detokenizer's module imports at its top but its decoding never uses, which cannot be
# imported without a GPU build (torchvision, setproctitle, the server's arguments).
_IMPORT_ONLY: dict[str, dict[str, Any]] = {
    "setproctitle": {"setproctitle": lambda *args: None},
    "sglang.srt.managers.io_struct": {
        name: type(name, (), {})
        for name in (
            "BatchEmbeddingOutput",
            "BatchStrOutput",
            "BatchTokenIDOutput",
            "ConfigureLoggingReq",
            "FreezeGCReq",
        )
    },
    "sglang.srt.managers.multi_tokenizer_mixin": {
        "MultiHttpWorkerDetokenizerMixin": type("MultiHttpWorkerDetokenizerMixin", (), {})
    },
    "sglang.srt.server_args": {"PortArgs": object, "ServerArgs": object},
    "sglang.srt.utils.hf_transformers_utils": {"get_tokenizer": None},
}


def detokenizer_module() -> Any:
    """sglang.srt.managers.detokenizer_manager, with stand-ins only for the imports that fail here."""
    added = []
    for name, attributes in _IMPORT_ONLY.items():
        try:
            importlib.import_module(name)
        except Exception:
            module = types.ModuleType(name)
            module.__dict__.update(attributes)
            sys.modules[name] = module
            added.append(name)
    try:
        return importlib.import_module("sglang.srt.managers.detokenizer_manager")
    finally:
        for name in added:
            sys.modules.pop(name, None)


class Server:
    def __init__(self, model_dir: str) -> None:
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir, trust_remote_code=True)
        self.stop_id = self.tokenizer.get_vocab()["<|im_end|>"]
        self.detokenizers = detokenizer_module()

    def replies(self, sample: dict[str, Any]) -> list[dict[str, Any]]:
        request = ChatCompletionRequest(
            model="moonshotai/kimi-k2.5",
            messages=sample["messages"],
            tools=sample["tools"] or None,
            **({} if sample["thinking"] else {"chat_template_kwargs": {"thinking": False}}),
        )
        finish = (
            {"type": "stop", "matched": self.stop_id}
            if sample["stopped"]
            else {"type": "length", "length": len(sample["completion_ids"])}
        )
        whole = "".join(self._detokenize(sample, request, finish, stream=False))
        chunks = self._detokenize(sample, request, finish, stream=True)
        return [
            {
                "key": sample["key"],
                "engine": "sglang",
                "mode": "whole",
                "text": whole,
                **_whole(whole, request),
            },
            {
                "key": sample["key"],
                "engine": "sglang",
                "mode": "stream",
                "text": "".join(chunks),
                **_streamed(chunks, request),
            },
        ]

    def _detokenize(self, sample: dict[str, Any], request: Any, finish: dict, stream: bool) -> list[str]:
        """The texts the detokenizer sends for this request, in order."""
        manager = self.detokenizers.DetokenizerManager.__new__(self.detokenizers.DetokenizerManager)
        manager.tokenizer = self.tokenizer
        manager.disable_tokenizer_batch_decode = False
        manager.is_tool_call_parser_gpt_oss = False
        manager.decode_status = self.detokenizers.LimitedCapacityDict(capacity=4)
        prompt, ids = sample["prompt_ids"], sample["completion_ids"]
        start = max(len(prompt) - PROMPT_OFFSET, 0)
        seen = list(prompt[start:])
        # serving_chat.py _process_messages: a request with tools keeps special tokens in the text.
        if request.tools and request.tool_choice != "none":
            request.skip_special_tokens = False
        params = request.to_sampling_params(stop=[], model_generation_config={})
        sent, texts = 0, []
        for count in range(1, len(ids) + 1):
            last = count == len(ids)
            if not (last or stream or count % NON_STREAM_INTERVAL == 0):
                continue
            so_far = seen + ids[:count]
            batch = SimpleNamespace(
                rids=[sample["key"]],
                decoded_texts=[""],
                decode_ids=[so_far[sent:]],
                read_offsets=[len(prompt) - start],
                finished_reasons=[finish if last else None],
                no_stop_trim=[False],
                skip_special_tokens=[params["skip_special_tokens"]],
                spaces_between_special_tokens=[params["spaces_between_special_tokens"]],
            )
            sent = len(so_far)
            texts.append(manager._decode_batch_token_id_output(batch)[0])
        return texts


def _thinking(request: Any) -> bool:
    """serving_chat.py _get_reasoning_from_request: K2.5's template thinks unless told not to."""
    kwargs = request.chat_template_kwargs
    return not kwargs or kwargs.get("thinking") is not False


def _earlier_calls(request: Any) -> int:
    """serving_chat.py _get_history_tool_calls_cnt."""
    return sum(len(m.tool_calls or []) for m in request.messages if m.role == "assistant")


def _call_id(name: str, index: int, request: Any) -> str:
    """serving_chat.py _process_tool_call_id, the kimi_k2 branch."""
    return f"functions.{name}:{_earlier_calls(request) + index}"


def _whole(text: str, request: Any) -> dict[str, Any]:
    """serving_chat.py _build_chat_response and _process_tool_calls."""
    parser = ReasoningParser(
        model_type="kimi_k2", stream_reasoning=False, force_reasoning=_thinking(request), request=request
    )
    reasoning, text = parser.parse_non_stream(text)
    calls: list[dict[str, Any]] = []
    if request.tools and request.tool_choice != "none":
        tools = FunctionCallParser(request.tools, "kimi_k2")
        if tools.has_tool_call(text):
            text, found = tools.parse_non_stream(text)
            calls = [
                {"id": _call_id(c.name, c.tool_index, request), "name": c.name, "arguments": c.parameters}
                for c in found
            ]
    return {"reasoning": reasoning or None, "content": text or "", "tool_calls": calls}


def _streamed(chunks: list[str], request: Any) -> dict[str, Any]:
    """serving_chat.py _generate_stream_content, _process_tool_call_stream and
    _check_for_unstreamed_tool_args, merged by index as a client does."""
    parser = ReasoningParser("kimi_k2", request.stream_reasoning, _thinking(request), request)
    tools = FunctionCallParser(request.tools, "kimi_k2") if request.tools else None
    reasoning, content = "", ""
    calls: dict[int, dict[str, Any]] = {}
    for number, chunk in enumerate(chunks):
        thought, chunk = parser.parse_stream_chunk(chunk)
        reasoning += thought or ""
        if tools is None or request.tool_choice == "none":
            content += chunk or ""
            continue
        normal, found = tools.parse_stream_chunk(chunk)
        content += normal or ""
        for call in found:
            merged = calls.setdefault(call.tool_index, {"id": None, "name": "", "arguments": ""})
            if call.name:
                merged["id"] = merged["id"] or _call_id(call.name, call.tool_index, request)
                merged["name"] += call.name
            merged["arguments"] += call.parameters or ""
        if number == len(chunks) - 1:
            detector = tools.detector
            arrived = getattr(detector, "prev_tool_call_arr", None)
            streamed = getattr(detector, "streamed_args_for_tool", None)
            if arrived and streamed and len(arrived) - 1 < len(streamed):
                index = len(arrived) - 1
                expected = json.dumps(arrived[index].get("arguments", {}), ensure_ascii=False)
                rest = expected.replace(streamed[index], "", 1) if streamed[index] in expected else ""
                if rest:
                    calls.setdefault(index, {"id": None, "name": "", "arguments": ""})["arguments"] += rest
    return {
        "reasoning": reasoning or None,
        "content": content,
        "tool_calls": [calls[i] for i in sorted(calls)],
    }


if __name__ == "__main__":
    model_dir, in_path, out_path = sys.argv[1:]
    replay(Server(model_dir), in_path, out_path)
