"""The API key file: one-line errors naming the path, a warning on loose permissions, never the key."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from eaglepipe.openrouter.errors import OpenRouterError
from eaglepipe.openrouter.secrets import read_api_key

SECRET = "sk-or-v1-TESTSECRET0123456789"


def key_file(tmp_path: Path, text: str, mode: int = 0o600) -> Path:
    path = tmp_path / "openrouter.key"
    path.write_text(text)
    path.chmod(mode)
    return path


def test_key_from_config_path_is_redacted(tmp_path: Path) -> None:
    key = read_api_key(str(key_file(tmp_path, SECRET + "\n")))
    assert key.authorization_header() == {"Authorization": f"Bearer {SECRET}"}
    assert SECRET not in repr(key) and SECRET not in str(key) and SECRET not in f"{key}"


def test_key_file_named_by_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENROUTER_KEY_FILE", str(key_file(tmp_path, SECRET)))
    assert read_api_key(None).authorization_header()["Authorization"].endswith(SECRET)


def test_no_key_file_configured(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENROUTER_KEY_FILE", raising=False)
    with pytest.raises(OpenRouterError, match="OPENROUTER_KEY_FILE"):
        read_api_key(None)


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        (None, "does not exist"),
        ("\n  \n", "is empty"),
        (f"{SECRET}\nsecond", "more than"),
        (f"{SECRET}\x7f", "non-printable"),  # an HTTP library would quote it in its own error
    ],
)
def test_bad_key_file_names_path_not_key(tmp_path: Path, text: str | None, problem: str) -> None:
    path = tmp_path / "missing.key" if text is None else key_file(tmp_path, text)
    with pytest.raises(OpenRouterError) as caught:
        read_api_key(str(path))
    message = str(caught.value)
    assert problem in message and str(path) in message and SECRET not in message
    assert "\n" not in message


def test_loose_permissions_warn_without_the_key(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = key_file(tmp_path, SECRET, mode=0o644)
    with caplog.at_level(logging.WARNING):
        read_api_key(str(path))
    assert "readable by group or others" in caplog.text and SECRET not in caplog.text
    caplog.clear()
    path.chmod(0o600)
    with caplog.at_level(logging.WARNING):
        read_api_key(str(path))
    assert caplog.text == ""


def test_a_key_given_where_the_file_belongs_is_not_echoed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENROUTER_KEY_FILE", SECRET)
    with pytest.raises(OpenRouterError) as info:
        read_api_key(None)
    assert "holds a key, not a path" in str(info.value) and SECRET not in str(info.value)
