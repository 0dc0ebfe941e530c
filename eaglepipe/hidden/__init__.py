"""Hidden states: the target run over the token ids (hf, vLLM or SGLang), stored as checksummed shards."""

from eaglepipe.errors import EaglepipeError


class HiddenError(EaglepipeError, ValueError):
    """A hidden-state stage problem a user can fix, in one line naming the file, key or prompt."""
