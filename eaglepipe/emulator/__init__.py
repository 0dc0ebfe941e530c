"""A local stand-in for OpenRouter: its API on 127.0.0.1, answered by the real target model or, in
synthetic mode, by made-up answers at a provider's pace (no model, for rehearsing big runs).

It is the embedded default of the pipeline and the rehearsal ground for the paid run: the same paths,
bodies, routing filters, errors and billing, so the client meets no surprise when pointed at OpenRouter.
Start it with `python -m eaglepipe.emulator` or, from Python, `eaglepipe.emulator.runner.running_emulator`.
"""
