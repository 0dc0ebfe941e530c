"""Stage 2: the exact token ids the target saw and produced, with a loss mask over its answer."""
