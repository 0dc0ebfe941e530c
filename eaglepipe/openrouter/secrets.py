"""The API key: read from a file named by the config or an environment variable, and never shown."""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

from eaglepipe.openrouter.errors import OpenRouterError

log = logging.getLogger(__name__)

KEY_FILE_ENV_VAR = "OPENROUTER_KEY_FILE"


class ApiKey:
    """Holds the key so that printing, logging or raising with it in scope shows nothing secret."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def __repr__(self) -> str:
        return "ApiKey(<redacted>)"

    __str__ = __repr__

    def authorization_header(self) -> dict[str, str]:
        """The only way out for the key: httpx redacts this header in its own reprs."""
        return {"Authorization": f"Bearer {self._value}"}


def read_api_key(key_file: str | None, env_var: str = KEY_FILE_ENV_VAR) -> ApiKey:
    """A key file rather than the key itself in config or environment keeps it out of logs and `ps`."""
    path_text = key_file or os.environ.get(env_var)
    if not path_text:
        raise OpenRouterError(
            f"no API key file: set the key file in the config or export {env_var}=/path/to/keyfile"
        )
    if path_text.strip().startswith("sk-"):
        raise OpenRouterError(
            f"the key file setting (config api.key_file or {env_var}) holds a key, not a path: "
            "put the key in a file and name that file instead"
        )
    path = Path(path_text).expanduser()
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise OpenRouterError(f"API key file {path} does not exist: write the key in it, one line") from None
    except OSError as error:
        raise OpenRouterError(
            f"API key file {path} cannot be read ({error.strerror}): fix its permissions"
        ) from None
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if not lines:
        raise OpenRouterError(f"API key file {path} is empty: write the key into it on one line")
    if len(lines) > 1 or len(lines[0].split()) > 1:
        raise OpenRouterError(f"API key file {path} holds more than the key: leave only the key on one line")
    if not lines[0].isascii() or not lines[0].isprintable():
        # An HTTP library would quote such a header value, key included, in its error message.
        raise OpenRouterError(f"API key file {path} holds a non-printable character: rewrite the key")
    if path.stat().st_mode & (stat.S_IRGRP | stat.S_IROTH):
        log.warning(
            "warning: API key file %s is readable by group or others, and the key is a secret: chmod 600 %s",
            path,
            path,
        )
    return ApiKey(lines[0])
