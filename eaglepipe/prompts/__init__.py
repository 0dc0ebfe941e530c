"""The prompt-set stage: a set's source (JSONL file or HF dataset) to `resources/prompts/{ds}.jsonl`."""

from eaglepipe.prompts.build import (
    build_from_source,
    build_prompt_set,
    check_edited_source,
    load_source,
    prepare_prompt_set,
    strip_setting,
)
from eaglepipe.prompts.ids import canonical_json, prompt_id
from eaglepipe.prompts.records import PromptRecord, read_prompt_set, write_prompt_set
from eaglepipe.prompts.sources import SkippedRow, SourcedRecord, load_hf, load_jsonl
from eaglepipe.prompts.validate import PromptError, validate_record

__all__ = [
    "PromptError",
    "PromptRecord",
    "SkippedRow",
    "SourcedRecord",
    "build_from_source",
    "build_prompt_set",
    "canonical_json",
    "check_edited_source",
    "load_hf",
    "load_jsonl",
    "load_source",
    "prepare_prompt_set",
    "prompt_id",
    "read_prompt_set",
    "strip_setting",
    "validate_record",
    "write_prompt_set",
]
