"""A local stand-in for OpenRouter: its API on 127.0.0.1, answered by the real target model (the tests add
made-up answers, the Kimi corpus and injected faults: tests/support/emulator, the faults through the
hook in faults.py).

It is the embedded default of the pipeline and the rehearsal ground for the paid run: the same paths,
bodies, routing filters, errors and billing, so the client meets no surprise when pointed at OpenRouter.
Start it with `python -m eaglepipe.emulator` or, from Python, `eaglepipe.emulator.runner.running_emulator`.
"""
