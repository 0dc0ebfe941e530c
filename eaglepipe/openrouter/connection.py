"""Which API a job reaches: `api.base_url: local` starts the bundled emulator serving the target for the
job's own duration (no key); anything else is a real API reached with the key file."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import cast

from eaglepipe.config import sets_to_buy
from eaglepipe.config_types import Config, RoutingSection
from eaglepipe.io import write_json
from eaglepipe.layout import RunLayout
from eaglepipe.openrouter.routing import ProvidersFile, RoutingPolicy, fetch_providers
from eaglepipe.openrouter.secrets import ApiKey, read_api_key
from eaglepipe.openrouter.settings import ApiSettings

log = logging.getLogger(__name__)


def routing_policy(routing: RoutingSection, max_tokens: int) -> RoutingPolicy:
    """The validated `routing` section as a policy; an empty allowlist means "no allowlist"."""
    return RoutingPolicy.from_config({**routing, "only": routing["only"] or None, "max_tokens": max_tokens})


@contextmanager
def api_connection(
    api: ApiSettings, emulator_log: Path | None = None, threads: int = 1, max_batch: int | None = None
) -> Iterator[tuple[str, ApiKey | None]]:
    """(base URL, key) for this job; the local emulator lives exactly as long as the `with` block."""
    if not api.local:
        yield api.base_url, read_api_key(api.key_file, api.key_file_env)
        return
    from eaglepipe.emulator.runner import running_emulator

    with running_emulator(
        Path(api.target_path),
        extra_args=[
            "--model-id",
            api.model,
            "--threads",
            str(threads),
            *(["--max-batch", str(max_batch)] if max_batch else []),
            *["--text-like", api.emulator_text_like],
        ],
        log_path=emulator_log,
    ) as base_url:
        yield base_url, None


def write_providers(
    out_path: Path, *, api: ApiSettings, routing: RoutingPolicy, emulator_log: Path | None = None
) -> None:
    """The providers rule: the configured model's endpoints after the routing policy."""
    with api_connection(api, emulator_log) as (base_url, key):
        providers = fetch_providers(base_url, api.model, key, routing)
    if api.local:
        providers["source"] = "local"  # the emulator's port changes every run; its identity does not
    write_json(out_path, providers)
    log.info("%s: kept %s", out_path, [e["tag"] for e in providers["kept"]])


def read_providers(path: Path) -> ProvidersFile:
    """providers.json as `write_providers` wrote it; OSError or ValueError when it is missing or torn."""
    return cast(ProvidersFile, json.loads(path.read_text()))


def check_key_for_pending_sets(config: Config, datasets: list[str], layout: RunLayout) -> None:
    """`onstart`: fail before any job when a set still needs bought answers and there is no usable key."""
    if sets_to_buy(config, datasets, layout):
        read_api_key(config["api"]["key_file"], config["api"]["key_file_env"])
