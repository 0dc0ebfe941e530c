"""The drafter in speculators' format, read by speculators itself and by vLLM's config parser.

Run with the vLLM environment's interpreter (`make vllm-env` installs speculators 0.9 there):
`.venv-vllm/bin/python tests/speculators_check.py DIR OUT.json`. It imports speculators, vLLM, torch and the
standard library only (not eaglepipe). It loads DIR with speculators' own classes (config, weights and the
verifier's embedding and lm_head, which speculators finds in the verifier named in the config), checks that
every tensor in the file reached the model unchanged, and writes what each library read as JSON.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from safetensors.torch import load_file


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("drafter")
    parser.add_argument("out", type=Path)
    args = parser.parse_args()

    from speculators.models.eagle3 import Eagle3DraftModel, Eagle3SpeculatorConfig

    config = Eagle3SpeculatorConfig.from_pretrained(args.drafter)
    model = Eagle3DraftModel.from_pretrained(args.drafter)
    state = model.state_dict()
    saved = load_file(str(Path(args.drafter) / "model.safetensors"))
    unloaded = sorted(
        name for name, tensor in saved.items() if name not in state or not torch.equal(state[name], tensor)
    )
    layer = config.transformer_layer_config
    facts = {
        "speculators": {
            "speculators_model_type": config.speculators_model_type,
            "draft_vocab_size": config.draft_vocab_size,
            "norm_before_residual": config.norm_before_residual,
            "eagle_aux_hidden_state_layer_ids": model.config.eagle_aux_hidden_state_layer_ids,
            "target_hidden_size": config.target_hidden_size,
            "layer": {k: getattr(layer, k) for k in ("hidden_size", "num_attention_heads", "head_dim")},
            "verifier": config.speculators_config.verifier.name_or_path,
            "tensors_not_loaded": unloaded,
            "embedding_shape": list(model.embed_tokens.weight.shape),
            "embedding_sum": float(model.embed_tokens.weight.double().sum()),
            # speculators fills the verifier's head with NaN until it has read it from the verifier's files
            "verifier_lm_head_loaded": bool(torch.isfinite(model.verifier_lm_head.weight).all()),
        },
    }
    from vllm.transformers_utils.config import get_config

    parsed = get_config(args.drafter, trust_remote_code=False)
    facts["vllm"] = {
        "model_type": parsed.model_type,
        "architectures": parsed.architectures,
        "norm_before_residual": getattr(parsed, "norm_before_residual", None),
        "eagle_aux_hidden_state_layer_ids": getattr(parsed, "eagle_aux_hidden_state_layer_ids", None),
        "draft_vocab_size": getattr(parsed, "draft_vocab_size", None),
    }
    args.out.write_text(json.dumps(facts, indent=1, default=str))


if __name__ == "__main__":
    main()
