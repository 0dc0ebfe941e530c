"""The base of every error a user can act on; each stage defines its own subclasses next to its code."""

from __future__ import annotations


class EaglepipeError(Exception):
    """A problem the user can fix, not a bug: the message is one actionable line naming the file, key or
    prompt id and what to do. A Snakemake job (`jobs.snakemake_job`) ends on one with that line alone, no
    traceback; any other exception is ours to debug and keeps its traceback."""
