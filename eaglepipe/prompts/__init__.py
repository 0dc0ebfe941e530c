"""The prompt-set stage: a set's source (JSONL file or HF dataset) to `resources/prompts/{ds}.jsonl`."""

from eaglepipe.prompts.build import build_from_source, build_prompt_set, load_source, write_prompt_set
from eaglepipe.prompts.ids import canonical_json, prompt_id
from eaglepipe.prompts.sources import SkippedRow, SourcedRecord, load_hf, load_jsonl
from eaglepipe.prompts.validate import PromptError, validate_record

__all__ = [
    "PromptError",
    "SkippedRow",
    "SourcedRecord",
    "build_from_source",
    "build_prompt_set",
    "canonical_json",
    "load_hf",
    "load_jsonl",
    "load_source",
    "prompt_id",
    "validate_record",
    "write_prompt_set",
]
