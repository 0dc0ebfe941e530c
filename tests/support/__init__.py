"""Scaffolding the tests share and the runtime package does without: imported as `support` (tests/ is on
the path under pytest, as for `tiny_run`; bench scripts and the engines' side scripts put it there)."""
