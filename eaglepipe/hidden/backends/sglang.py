"""SGLang's model runner in process, tensor-parallel over the job's GPUs: the backend for Kimi-K2.5 and other
targets too large for transformers, as SpecForge's offline preparation drives it.

The worker (`sglang_worker`, one process per GPU rank under the interpreter of SGLang's environment) builds
SGLang's `ModelRunner`, asks the model for EAGLE-3's aux layers through `set_eagle3_layers_to_capture`, and
reads them, with the final post-norm states and the prefilled ids, from the inputs of the model's logits
step. Nothing goes through HTTP or Python lists: states come back as safetensors files.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from eaglepipe.hidden import HiddenError
from eaglepipe.hidden.backends import BackendSettings
from eaglepipe.hidden.backends.engine_process import EngineBackend, EngineProcess
from eaglepipe.target.architecture import TargetArchitecture
from eaglepipe.target.layer_ids import sglang_capture_ids


class SGLangBackend(EngineBackend):
    """SGLang hands the logits step post-norm states: `final` is taken as it comes."""

    def __init__(
        self,
        settings: BackendSettings,
        target_dir: Path,
        aux_layers: list[int],
        target: TargetArchitecture,
        longest_sample: int,
    ) -> None:
        if settings.gpus < 1:
            raise HiddenError(
                "config key 'hidden.backend' = sglang needs GPUs (hidden.gpus >= 1): SGLang has no CPU "
                "build; use hidden.backend hf or vllm on CPU"
            )
        if sorted(aux_layers) != list(aux_layers):
            raise HiddenError(f"config key 'hidden.aux_layers' = {aux_layers}: list them in increasing order")
        self.engine = EngineProcess(
            "sglang",
            settings.engine_python or sys.executable,
            "eaglepipe.hidden.backends.sglang_worker",
            [
                "--target",
                str(target_dir),
                "--capture-ids",
                json.dumps(sglang_capture_ids(aux_layers)),
                "--dtype",
                settings.compute_dtype,
                "--tensor-parallel",
                str(settings.gpus),
                "--context-length",
                str(longest_sample + 1),
                "--batch-tokens",
                str(max(settings.batch_tokens, longest_sample)),
                "--memory-fraction",
                str(settings.engine_memory_fraction),
                "--hidden-size",
                str(target.hidden_size),
            ],
        )
