"""The SGLang side of the `sglang` backend: one model runner per GPU rank, fed samples on request.

Runs under the interpreter of the environment SGLang is installed in (the `gpu` extra, SGLang 0.5.14). The
process started by the driver is rank 0; it starts ranks 1..N-1, and every rank builds SGLang's
`ModelRunner` the way SGLang's own tensor-parallel workers do (weights sharded, NCCL between ranks). Rank 0
reads the requests and hands each to the other ranks over SGLang's CPU group; all ranks prefill the same
batch; rank 0 writes the states:
- aux layers: `set_eagle3_layers_to_capture(ids)` (our output-of-layer ids starting at 1; both SGLang
  families turn them into the input-of-layer ids i + 1, see `eaglepipe.target.layer_ids`);
- final: the post-norm states, the ids it prefilled, read from the inputs of the model's logits step by a
  forward pre-hook (the lm_head still runs, on the last position of each sample only).
"""

from __future__ import annotations

import argparse
import json
import socket
from array import array
from typing import Any, TypedDict

from eaglepipe.hidden.backends import gpu_memory_problem
from eaglepipe.hidden.backends.engine_process import WorkerReplies

SGLANG_VERSION = "0.5.14"


class ServerArguments(TypedDict):
    """The `sglang.Engine` keywords this worker sets (`server_arguments`)."""

    model_path: str
    dtype: str
    tp_size: int
    device: str
    trust_remote_code: bool
    skip_tokenizer_init: bool
    context_length: int
    mem_fraction_static: float
    disable_cuda_graph: bool
    disable_radix_cache: bool
    chunked_prefill_size: int
    enable_return_hidden_states: bool


def server_arguments(args: argparse.Namespace) -> ServerArguments:
    """SGLang's ServerArgs for a prefill-only run: no CUDA graphs (prefill shapes vary), no radix cache (every
    sample is prefilled whole, so each token's state is computed, not looked up), no chunked prefill."""
    return {
        "model_path": args.target,
        "dtype": args.dtype,
        "tp_size": args.tensor_parallel,
        "device": "cuda",
        "trust_remote_code": True,
        "skip_tokenizer_init": True,
        "context_length": args.context_length,
        "mem_fraction_static": args.memory_fraction,
        "disable_cuda_graph": True,
        "disable_radix_cache": True,
        "chunked_prefill_size": -1,
        "enable_return_hidden_states": True,
    }


def version_problem() -> str | None:
    import sglang

    if sglang.__version__ != SGLANG_VERSION:
        return (
            f"SGLang {sglang.__version__} is installed, the sglang backend is written against "
            f"{SGLANG_VERSION}: pip install -c constraints-gpu.txt -e '.[gpu]'"
        )
    return None


class LogitsInputs:
    """Keeps what the model hands its logits step: the prefilled ids, the post-norm states and the aux
    layers captured by `set_eagle3_layers_to_capture`."""

    def __init__(self, model: Any) -> None:
        from sglang.srt.layers.logits_processor import LogitsProcessor

        heads = [module for module in model.modules() if isinstance(module, LogitsProcessor)]
        if len(heads) != 1:
            raise RuntimeError(f"expected one LogitsProcessor in {type(model).__name__}, found {len(heads)}")
        self.seen: tuple[Any, Any, list[Any]] | None = None
        heads[0].register_forward_pre_hook(self._keep)

    def _keep(self, _module: Any, inputs: tuple[Any, ...]) -> None:
        input_ids, hidden_states, _lm_head, _batch, *rest = inputs
        aux = rest[0] if rest else None
        if not aux:
            raise RuntimeError(
                "the model passed no aux hidden states: set_eagle3_layers_to_capture had no effect"
            )
        self.seen = (input_ids, hidden_states, list(aux))


def build_runner(args: argparse.Namespace, rank: int, port: int) -> Any:
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.model_executor.model_runner import ModelRunner
    from sglang.srt.server_args import ServerArgs

    server_args = ServerArgs(**server_arguments(args))
    runner = ModelRunner(
        model_config=ModelConfig.from_server_args(server_args),
        mem_fraction_static=server_args.mem_fraction_static,
        gpu_id=rank,
        tp_rank=rank,
        tp_size=server_args.tp_size,
        moe_ep_rank=rank * server_args.ep_size // server_args.tp_size,
        moe_ep_size=server_args.ep_size,
        pp_rank=0,
        pp_size=1,
        nccl_port=port,
        server_args=server_args,
    )
    # What SGLang's TpModelWorker does after building the runner (no CUDA graphs: disabled above).
    runner.alloc_memory_pool()
    runner.init_attention_backends()
    runner.model.set_eagle3_layers_to_capture(args.capture_ids)
    return runner


def prefill(runner: Any, capture: LogitsInputs, samples: list[list[int]]) -> tuple[Any, Any]:
    """(states [T, 4, H]: the aux layers then the final post-norm state, prefilled ids [T]) of one batch."""
    import torch
    from sglang.srt.managers.schedule_batch import Req, ScheduleBatch
    from sglang.srt.mem_cache.cache_init_params import CacheInitParams
    from sglang.srt.mem_cache.chunk_cache import ChunkCache
    from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode, ForwardBatch
    from sglang.srt.sampling.sampling_params import SamplingParams
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    one_token = SamplingParams(max_new_tokens=1, temperature=0.0)
    requests = [
        Req(rid=str(i), origin_input_text="", origin_input_ids=array("q", ids), sampling_params=one_token)
        for i, ids in enumerate(samples)
    ]
    for request in requests:
        request.init_next_round_input()
    cache = ChunkCache(
        CacheInitParams(
            disable=True,
            req_to_token_pool=runner.req_to_token_pool,
            token_to_kv_pool_allocator=runner.token_to_kv_pool_allocator,
            page_size=runner.page_size,
        )
    )
    batch = ScheduleBatch.init_new(
        requests,
        runner.req_to_token_pool,
        runner.token_to_kv_pool_allocator,
        cache,
        runner.model_config,
        enable_overlap=False,
        spec_algorithm=SpeculativeAlgorithm.NONE,
    )
    batch.prepare_for_extend()
    batch.capture_hidden_mode = CaptureHiddenMode.FULL
    forward_batch = ForwardBatch.init_new(batch, runner)
    forward_batch.capture_hidden_mode = CaptureHiddenMode.FULL
    capture.seen = None
    runner.forward(forward_batch)
    runner.req_to_token_pool.clear()
    runner.token_to_kv_pool_allocator.clear()
    if capture.seen is None:
        raise RuntimeError("the logits step never ran")
    input_ids, final, aux = capture.seen
    states = torch.stack([*aux, final], dim=1)  # [T, 4, H]
    return states.float().cpu(), input_ids.to(torch.int64).cpu()


def batches(samples: list[list[int]], batch_tokens: int) -> list[list[list[int]]]:
    out: list[list[list[int]]] = [[]]
    for ids in samples:
        if out[-1] and sum(map(len, out[-1])) + len(ids) > batch_tokens:
            out.append([])
        out[-1].append(ids)
    return out


def serve_rank(args: argparse.Namespace, rank: int, port: int, replies: WorkerReplies | None) -> None:
    import torch
    import torch.distributed as dist
    from safetensors.torch import load_file, save_file
    from sglang.srt.distributed import get_tp_group

    torch.cuda.set_device(rank)
    runner = build_runner(args, rank, port)
    capture = LogitsInputs(runner.model)
    group = get_tp_group().cpu_group
    requests = replies.requests() if replies else None
    if replies:
        replies.ready()
    while True:
        message = [next(requests, None) if requests else None]
        dist.broadcast_object_list(message, src=0, group=group)
        if message[0] is None:
            return
        samples_path, out_path = message[0]
        loaded = load_file(samples_path)
        offsets, ids = loaded["offsets"].tolist(), loaded["input_ids"].tolist()
        samples = [ids[a:b] for a, b in zip(offsets, offsets[1:], strict=False)]
        parts = [prefill(runner, capture, batch) for batch in batches(samples, args.batch_tokens)]
        if replies:
            states = torch.cat([states for states, _ in parts])
            if states.shape[-1] != args.hidden_size:
                replies.error(
                    f"SGLang returned states of width {states.shape[-1]}, the target's is {args.hidden_size}"
                )
                return
            save_file({"hidden_states": states, "token_ids": torch.cat([ids for _, ids in parts])}, out_path)
            replies.done(out_path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--target", required=True)
    parser.add_argument("--capture-ids", required=True, type=json.loads)
    parser.add_argument("--dtype", required=True)
    parser.add_argument("--tensor-parallel", type=int, required=True)
    parser.add_argument("--context-length", type=int, required=True)
    parser.add_argument("--batch-tokens", type=int, required=True)
    parser.add_argument("--memory-fraction", type=float, default=0.85)
    parser.add_argument("--hidden-size", type=int, required=True)
    parser.add_argument("--reply-fd", type=int, required=True)
    args = parser.parse_args()
    replies = WorkerReplies(args.reply_fd)
    problem = version_problem()
    if problem:
        replies.error(problem)
        return
    import torch
    import torch.multiprocessing as mp

    if torch.cuda.device_count() < args.tensor_parallel:
        replies.error(
            f"hidden.gpus is {args.tensor_parallel} but {torch.cuda.device_count()} GPUs are visible: "
            "give the job the GPUs it asks for (resources gpu) or lower hidden.gpus"
        )
        return
    problem = gpu_memory_problem(args.target, args.tensor_parallel, args.memory_fraction)
    if problem:
        replies.error(problem)
        return
    with socket.socket() as probe:  # a free port for the ranks' NCCL rendezvous
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    context = mp.get_context("spawn")
    others = [
        context.Process(target=serve_rank, args=(args, rank, port, None))
        for rank in range(1, args.tensor_parallel)
    ]
    for process in others:
        process.start()
    try:
        serve_rank(args, 0, port, replies)
    finally:
        for process in others:
            process.join(timeout=60)
            if process.is_alive():
                process.kill()


if __name__ == "__main__":  # spawned ranks import this module
    main()
