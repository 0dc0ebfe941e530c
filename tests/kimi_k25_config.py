"""Kimi-K2.5's config.json as the real checkpoint has it, for config-level checks (no weights): the copy the
package ships for the spend plan (eaglepipe/target/published/).
Shapes from Moonshot's model files: 61 layers (the first dense), hidden 7168, MLA with 64 heads, 384 routed
experts (8 per token) and a shared one, vocab 163,840."""

import json

from eaglepipe.target.architecture import published_config_dir

KIMI_K25 = json.loads((published_config_dir("moonshotai/Kimi-K2.5") / "config.json").read_text())
KIMI_K25_TEXT = KIMI_K25["text_config"]
