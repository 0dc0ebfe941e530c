"""The serving engines' own code, driven with known ids: what text vLLM and SGLang really return.

The token stage undoes what engines do to Kimi-K2.5's text; this harness is how we know what that is. It
feeds completion ids through vLLM's detokenizer and Kimi parsers and SGLang's detokenizing decode and Kimi
parsers, streamed and not, each in its own virtual environment (`make vllm-env`, `make sglang-env`), and
keeps the replies as a ground-truth corpus (`PYTHONPATH=tests python -m support.engines.corpus OUT [COUNT]`,
docs/tokens.md; `tests/test_engine_habits.py` checks the token stage against it).
"""
