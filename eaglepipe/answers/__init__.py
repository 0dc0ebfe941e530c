"""Prompt-set answers that come from somewhere other than buying them (`answers.sets.{ds}.source`)."""
