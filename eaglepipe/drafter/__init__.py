"""The EAGLE-3 drafter: model, draft vocabulary, training data, training, export and evaluation."""

from eaglepipe.errors import EaglepipeError


class DrafterError(EaglepipeError, ValueError):
    """Bad input a user can fix: the message names the file, key or prompt and what to do."""
