"""Stage 3: the target's hidden states over the token ids, in resumable shards."""
