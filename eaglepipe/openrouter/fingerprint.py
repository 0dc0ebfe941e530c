"""Which journal records may be reused: those made by an identical request."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from eaglepipe.config_types import Config

FINGERPRINT_HEX_CHARS = 16


def request_fingerprint(
    model: str,
    base_url: str,
    # Hashed as JSON: the routing section or the request's provider object.
    provider_obj: Mapping[str, Any] | None,
    sampling: dict[str, Any],
    max_tokens: int,
    reasoning: dict[str, Any] | None,
    response_options: dict[str, Any] | None = None,
) -> str:
    """Everything that changes what a prompt's response may be, hashed so a changed config never reuses
    old responses. 16 hex chars (64 bits) make a collision between the few configs one journal sees
    negligible while staying short enough to read in every record and log line.

    Unset sampling values (None) are dropped, as they are from the request body. `response_options` holds
    what changes the answer's form rather than its content (e.g. `return_token_ids`, the emulator's
    engine-like text), which the token stage depends on just as much.
    `base_url` names the server, not its current socket: pass the configured value (e.g. the emulator's
    stable name), not a per-run port, or every run gets a new fingerprint and nothing resumes.
    """
    identity = {
        "model": model,
        "base_url": base_url.rstrip("/"),
        "provider": provider_obj,
        "sampling": {key: value for key, value in sampling.items() if value is not None},
        "max_tokens": max_tokens,
        "reasoning": reasoning,
    }
    if response_options:
        identity["response_options"] = response_options
    canonical = json.dumps(identity, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()[:FINGERPRINT_HEX_CHARS]


def config_fingerprint(config: Config) -> str:
    """The fingerprint of the requests a validated config sends (the generate rule's param)."""
    gen = config["generation"]
    return request_fingerprint(
        model=config["api"]["model"],
        base_url=config["api"]["base_url"],
        provider_obj=config["routing"],
        sampling={"temperature": gen["temperature"], "top_p": gen["top_p"], "seed": gen["seed"]},
        max_tokens=gen["max_tokens"],
        reasoning=gen["reasoning"],
        response_options={
            "return_token_ids": gen["return_token_ids"],
            "emulator_text_like": config["api"]["emulator_text_like"],
            # Only when asked, so turning it on is what changes the fingerprint of existing runs.
            **({"logprobs": True} if gen["logprobs"] else {}),
        },
    )


def engine_fingerprint(config: Config) -> str:
    """The fingerprint of an engine set's requests: the target and the engine serving it, not the URL
    (a started server's port changes every run) nor the routing (an engine has none)."""
    gen = config["generation"]
    return request_fingerprint(
        model=config["target"]["name"],
        base_url=f"engine:{config['engine']['server']}",
        provider_obj=None,
        sampling={"temperature": gen["temperature"], "top_p": gen["top_p"], "seed": gen["seed"]},
        max_tokens=gen["max_tokens"],
        reasoning=gen["reasoning"],
        response_options={"token_ids": "engine"},
    )
