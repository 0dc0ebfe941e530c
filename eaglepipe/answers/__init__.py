"""The answers stage: one prompt set's `responses.jsonl`, bought through OpenRouter (or the emulator standing
in for it), asked of the team's own engine, or imported from answers the team already has. Each source is one
`AnswerSource` behind one job description (`job.py`); OpenRouter's client, routing, billing and ledger are
the `eaglepipe.openrouter` package below this one."""
