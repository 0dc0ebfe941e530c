"""What an informed config says about the engine behind each `text_like` switch.

Kept with the tests: `eaglepipe.emulator.text_like` imitates engines and `eaglepipe.tokens` undoes them,
and neither imports the other; only the tests (and bench/reconstruction.py) join the two.
"""

from __future__ import annotations

from eaglepipe.emulator.text_like import EngineSwitch
from eaglepipe.tokens.profile import ProviderPin


def pin_for(switch: EngineSwitch) -> ProviderPin:
    """What an informed config says about the engine behind `switch`: the `tokens.providers` entry."""
    return ProviderPin(
        switch.whitespace,
        "renumber" if switch.renumber_tool_ids else "keep",
        "trim" if switch.trim_arguments else "keep",
        switch.bills_stop_token,
    )
