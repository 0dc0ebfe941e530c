"""TEST ONLY: lets vLLM's CPU attention take KV blocks of 16 tokens, when EAGLEPIPE_TEST_CPU_ATTN_BLOCK16=1.

On a CPU without AMX, vLLM 0.32 runs a DeepSeek-V3/Kimi target's MLA with blocks of 16 only (CPU_MLA), and
an EAGLE-3 drafter's attention with multiples of 32 (CPU_ATTN), so an EAGLE-3 engine on that target stops
at start: "No common block size for 16". CPU_ATTN's own `vec16` kernel, which it picks for any block size
that is not a multiple of 32, computes blocks of 16 exactly; only the sizes the backend declares are
changed. GPUs and AMX CPUs never meet this, so the pipeline's serving instructions need nothing of it.
"""

import os


def register() -> None:
    if os.environ.get("EAGLEPIPE_TEST_CPU_ATTN_BLOCK16") != "1":
        return
    from vllm.v1.attention.backend import MultipleOf
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

    def supported_block_sizes(kv_cache_spec: object = None) -> list[MultipleOf]:
        return [MultipleOf(16)]

    CPUAttentionBackend.get_supported_kernel_block_sizes = staticmethod(supported_block_sizes)
