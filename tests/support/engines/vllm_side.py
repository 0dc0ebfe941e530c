"""Run inside vLLM's environment (`make vllm-env`): known completion ids through vLLM's own serving path.

For each sample of the input JSONL it does what vLLM 0.32's OpenAI server does with a chat request
started with `--reasoning-parser kimi_k2 --tool-call-parser kimi_k2 --enable-auto-tool-choice`: the
parser adjusts the request (it turns `skip_special_tokens` off), the request becomes SamplingParams, the
output processor detokenizes one generated id per engine step (the stop token ends the request and is
not detokenized), and the Kimi parser splits the text into reasoning, content and tool calls, once on
the final text (non-streamed) and delta by delta as the server streams it. Every request asks the sampled
token's logprob (`logprobs: true, top_logprobs: 0`, which changes no text): each engine step carries it,
vLLM's `LogprobsProcessor` decodes each token alone, and the reply's `logprobs` are the entries vLLM's
`_create_chat_logprobs` builds from those decoded tokens. Written as one JSON line per sample and mode.
The tokenizer is the target directory's, loaded as vLLM loads it (`trust_remote_code`).

    PYTHONPATH=tests:. .venv-vllm/bin/python tests/support/engines/vllm_side.py MODEL_DIR IN.jsonl OUT.jsonl
"""

from __future__ import annotations

import sys
import time
from types import SimpleNamespace
from typing import Any

import numpy as np
from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
from vllm.parser import ParserManager
from vllm.tokenizers import get_tokenizer
from vllm.v1.engine import EngineCoreOutput, EngineCoreRequest, FinishReason
from vllm.v1.engine.output_processor import OutputProcessor
from vllm.v1.outputs import LogprobsLists

from support.engines.replay import replay

SAMPLED_LOGPROB = -0.5  # every step's: no model ran, and nothing reads the value
# The model type selects the `functions.NAME:N` id convention in vLLM's Kimi parser.
MODEL_CONFIG = SimpleNamespace(
    hf_config=SimpleNamespace(model_type="kimi_k25"),
    hf_text_config=SimpleNamespace(model_type="deepseek_v3"),
    hf_overrides={},
)


class Server:
    def __init__(self, model_dir: str) -> None:
        self.tokenizer = get_tokenizer(model_dir, trust_remote_code=True)
        self.stop_id = self.tokenizer.get_vocab()["<|im_end|>"]  # Kimi's generation config: eos_token_id
        self.parser_class = ParserManager.get_parser(
            tool_parser_name="kimi_k2",
            reasoning_parser_name="kimi_k2",
            enable_auto_tools=True,
            model_name=model_dir,
            tokenizer=self.tokenizer,
        )

    def replies(self, sample: dict[str, Any]) -> list[dict[str, Any]]:
        return [self._whole(sample), self._streamed(sample)]

    def _request(self, sample: dict[str, Any], stream: bool) -> tuple[Any, Any, EngineCoreRequest]:
        ids = sample["completion_ids"]
        request = ChatCompletionRequest(
            model="moonshotai/kimi-k2.5",
            messages=[{"role": "user", "content": "-"}],
            tools=sample["tools"] or None,
            stream=stream,
            logprobs=True,
            top_logprobs=0,
            max_completion_tokens=len(ids) if not sample["stopped"] else len(ids) + 16,
            **({} if sample["thinking"] else {"chat_template_kwargs": {"thinking": False}}),
        )
        kwargs = request.build_chat_params(None, "auto").with_defaults({}).chat_template_kwargs
        request = self._parser(request, kwargs).adjust_request(request=request)
        params = request.to_sampling_params(request.max_completion_tokens, {})
        params.update_from_generation_config({"eos_token_id": self.stop_id}, self.tokenizer.eos_token_id)
        core = EngineCoreRequest(
            request_id=sample["key"],
            prompt_token_ids=sample["prompt_ids"],
            mm_features=None,
            sampling_params=params,
            pooling_params=None,
            arrival_time=time.time(),
            lora_request=None,
            cache_salt=None,
            data_parallel_rank=None,
            external_req_id=sample["key"],
        )
        return request, kwargs, core

    def _parser(self, request: Any, kwargs: Any) -> Any:
        return self.parser_class(
            self.tokenizer, request.tools, model_config=MODEL_CONFIG, chat_template_kwargs=kwargs
        )

    def _steps(self, sample: dict[str, Any]) -> list[EngineCoreOutput]:
        """One engine step per id, with its logprob as the sampler sends it (the sampled id first, rank 1;
        the value is a stand-in, no model ran); the last finishes the request (stop id or length limit)."""
        ids = sample["completion_ids"]
        finish = FinishReason.STOP if sample["stopped"] else FinishReason.LENGTH
        return [
            EngineCoreOutput(
                request_id=sample["key"],
                new_token_ids=[token],
                new_logprobs=LogprobsLists(
                    np.array([[token]], dtype=np.int32),
                    np.array([[SAMPLED_LOGPROB]], dtype=np.float32),
                    np.array([1], dtype=np.int32),
                ),
                finish_reason=finish if last else None,
                stop_reason=self.stop_id if last and sample["stopped"] else None,
            )
            for last, token in ((i == len(ids) - 1, t) for i, t in enumerate(ids))
        ]

    def _outputs(self, core: EngineCoreRequest, sample: dict[str, Any]) -> list[Any]:
        processor = OutputProcessor(self.tokenizer, log_stats=False)
        processor.add_request(core, None)
        return [
            output.outputs[0]
            for step in self._steps(sample)
            for output in processor.process_outputs([step]).request_outputs
        ]

    def _whole(self, sample: dict[str, Any]) -> dict[str, Any]:
        request, kwargs, core = self._request(sample, stream=False)
        final = self._outputs(core, sample)[-1]
        parser = self._parser(request, kwargs)
        parser.set_prompt_token_ids(sample["prompt_ids"])
        reasoning, content, calls = parser.parse(
            final.text, request, enable_auto_tools=True, model_output_token_ids=final.token_ids
        )
        tool_calls = [{"id": c.id, "name": c.name, "arguments": c.arguments} for c in calls or []]
        logprobs = chat_logprobs(final.token_ids, final.logprobs)
        return _reply(sample, "whole", final.text, reasoning, content, tool_calls, logprobs)

    def _streamed(self, sample: dict[str, Any]) -> dict[str, Any]:
        request, kwargs, core = self._request(sample, stream=True)
        parser = self._parser(request, kwargs)
        text, reasoning, content = "", None, None
        calls: dict[int, dict[str, Any]] = {}
        logprobs: list[dict[str, Any]] = []
        for output in self._outputs(core, sample):
            text += output.text
            logprobs += chat_logprobs(output.token_ids, output.logprobs)  # every chunk carries its own
            delta = parser.parse_delta(
                delta_text=output.text,
                delta_token_ids=list(output.token_ids),
                request=request,
                prompt_token_ids=sample["prompt_ids"],
                finished=output.finish_reason is not None,
            )
            sent = delta.model_dump(exclude_unset=True) if delta is not None else {}
            if sent.get("reasoning") is not None:
                reasoning = (reasoning or "") + sent["reasoning"]
            if sent.get("content") is not None:
                content = (content or "") + sent["content"]
            for call in sent.get("tool_calls", []):  # merged by index, as an OpenAI client does
                merged = calls.setdefault(call["index"], {"id": None, "name": "", "arguments": ""})
                merged["id"] = merged["id"] or call.get("id")
                function = call.get("function") or {}
                merged["name"] += function.get("name") or ""
                merged["arguments"] += function.get("arguments") or ""
        tool_calls = [calls[i] for i in sorted(calls)]
        return _reply(sample, "stream", text, reasoning, content, tool_calls, logprobs)


def chat_logprobs(token_ids: list[int], top_logprobs: list[dict[int, Any]]) -> list[dict[str, Any]]:
    """`logprobs.content` as vLLM's `OpenAIServingChat._create_chat_logprobs` builds it when each step's
    logprobs hold the sampled id: `token` is the `decoded_token` vLLM's LogprobsProcessor made (vLLM's
    `_get_decoded_token`), `bytes` its UTF-8 (`errors="replace"`), so a token that is part of a character
    shows what that decoding made of it, not its own bytes. Kept as our client journals it (`token`,
    `bytes`, `logprob`; eaglepipe/openrouter/replies.py)."""
    entries = []
    for token_id, step in zip(token_ids, top_logprobs, strict=True):
        sampled = step[token_id]
        entries.append(
            {
                "token": sampled.decoded_token,
                "bytes": list(sampled.decoded_token.encode("utf-8", errors="replace")),
                "logprob": max(sampled.logprob, -9999.0),
            }
        )
    return entries


def _reply(
    sample: dict[str, Any],
    mode: str,
    text: str,
    reasoning: Any,
    content: Any,
    tool_calls: list[dict],
    logprobs: list[dict[str, Any]],
) -> dict[str, Any]:
    return {
        "key": sample["key"],
        "engine": "vllm",
        "mode": mode,
        "text": text,
        "reasoning": reasoning,
        "content": content,
        "tool_calls": tool_calls,
        "logprobs": logprobs,
    }


if __name__ == "__main__":
    model_dir, in_path, out_path = sys.argv[1:]
    replay(Server(model_dir), in_path, out_path)
