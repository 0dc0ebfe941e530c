"""A real headless Chromium driven over the DevTools protocol on a pipe (`--remote-debugging-pipe`), with
the standard library alone: the report test clicks through the Snakemake report as a person does and reads
the text a page (or a frame in it) shows."""

from __future__ import annotations

import base64
import fcntl
import json
import os
import select
import subprocess
import time
from typing import Any

# Chromium reads the protocol's commands from fd 3 and writes its replies to fd 4, each message a JSON text
# ended by a NUL byte.
COMMAND_FD, REPLY_FD = 3, 4


class DevToolsError(RuntimeError):
    """Chromium answered a command with an error, or not in time."""


class HeadlessChromium:
    """One browser process; `open` a page, `evaluate` JavaScript in it, read its frames' text."""

    def __init__(self, executable: str, timeout_s: float = 60) -> None:
        self.timeout_s = timeout_s
        command_read, self._command_write = os.pipe()
        self._reply_read, reply_write = os.pipe()

        def place_pipes() -> None:  # in the child, before exec: the pipes at the fds Chromium reads
            high_read = fcntl.fcntl(command_read, fcntl.F_DUPFD, 10)
            high_write = fcntl.fcntl(reply_write, fcntl.F_DUPFD, 10)
            os.dup2(high_read, COMMAND_FD)
            os.dup2(high_write, REPLY_FD)

        self.process = subprocess.Popen(
            [executable, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
             "--window-size=1400,1000", "--remote-debugging-pipe", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, close_fds=False, preexec_fn=place_pipes,
        )
        os.close(command_read)
        os.close(reply_write)
        self._buffer = b""
        self._next_id = 0

    def __enter__(self) -> HeadlessChromium:
        return self

    def __exit__(self, *exc: object) -> None:
        self.process.kill()
        self.process.wait(timeout=30)
        os.close(self._command_write)
        os.close(self._reply_read)

    def call(self, method: str, session: str | None = None, **params: Any) -> dict[str, Any]:
        """Send one command (to a page's `session`, or the browser) and wait for its reply."""
        self._next_id += 1
        message: dict[str, Any] = {"id": self._next_id, "method": method, "params": params}
        if session:
            message["sessionId"] = session
        os.write(self._command_write, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + self.timeout_s
        while True:
            reply = self._read_message(deadline)
            if reply.get("id") == self._next_id:  # events and other sessions' replies carry no such id
                if "error" in reply:
                    raise DevToolsError(f"{method}: {reply['error']}")
                return reply["result"]

    def _read_message(self, deadline: float) -> dict[str, Any]:
        while b"\0" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self._reply_read], [], [], left)[0]:
                raise DevToolsError("no reply from Chromium in time")
            chunk = os.read(self._reply_read, 1 << 16)
            if not chunk:
                raise DevToolsError(f"Chromium exited: {self.process.stderr.read().decode()[-2000:]}")
            self._buffer += chunk
        message, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(message)

    def open(self, url: str) -> str:
        """A new tab on `url`; returns its session for `evaluate`."""
        target = self.call("Target.createTarget", url=url)["targetId"]
        return self.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]

    def evaluate(self, session: str, expression: str, context: int | None = None) -> Any:
        """The value of a JavaScript expression in the page (or in the frame whose `context` is given)."""
        params: dict[str, Any] = {"expression": expression, "returnByValue": True, "awaitPromise": True}
        if context is not None:
            params["contextId"] = context
        result = self.call("Runtime.evaluate", session, **params)
        if "exceptionDetails" in result:
            raise DevToolsError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def wait_for(self, session: str, expression: str) -> Any:
        """Poll until the expression is truthy (the page renders after it loads; until then it may also
        throw, on a document with no body yet); returns its value."""
        deadline = time.monotonic() + self.timeout_s
        last_error = None
        while time.monotonic() < deadline:
            try:
                value = self.evaluate(session, expression)
            except DevToolsError as error:
                value, last_error = None, error
            if value:
                return value
            time.sleep(0.2)
        raise DevToolsError(f"never true: {expression} (last error: {last_error})")

    def frame_texts(self, session: str) -> list[str]:
        """The text each frame inside the page shows, read in the frame itself (its own origin: a data:
        URL's frame is closed to the page's scripts, not to the protocol)."""
        tree = self.call("Page.getFrameTree", session)["frameTree"]
        texts = []
        for child in tree.get("childFrames", []):
            world = self.call("Page.createIsolatedWorld", session, frameId=child["frame"]["id"])
            texts.append(self.evaluate(session, "document.body ? document.body.innerText : ''",
                                       world["executionContextId"]))
        return texts

    def screenshot(self, session: str) -> bytes:
        """What the tab shows now, as PNG bytes."""
        return base64.b64decode(self.call("Page.captureScreenshot", session, format="png")["data"])
