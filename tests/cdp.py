"""A headless Chromium driven over the DevTools protocol, with nothing but the standard library:
the browser is started with ``--remote-debugging-pipe`` and reads commands on its file
descriptor 3 and answers on 4, one JSON message each, ended by a NUL byte.

tests/project/test_docs_site.py opens the built documentation from disk with it. `find_chromium`
says which browser is there (None where none is): ``FOLNET_CHROMIUM`` names one, else the usual
names on PATH.
"""

from __future__ import annotations

import fcntl
import json
import os
import select
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "chrome",
         "headless_shell")
BASH = shutil.which("bash") or "/bin/bash"


def find_chromium() -> str | None:
    """The browser to drive: ``$FOLNET_CHROMIUM``, else the first of `NAMES` on PATH."""
    named = os.environ.get("FOLNET_CHROMIUM")
    if named:
        return named
    for name in NAMES:
        found = shutil.which(name)
        if found:
            return found
    return None


class BrowserError(RuntimeError):
    """The browser answered a command with an error, went away, or did not answer in time."""


def _high(fd: int) -> int:
    """``fd`` moved above 9, so that placing the child's ends at 3 and 4 overwrites neither."""
    moved = fcntl.fcntl(fd, fcntl.F_DUPFD, 10)
    os.close(fd)
    return moved


class Chromium:
    """One headless browser process; `command` sends a protocol command and waits for its
    answer, keeping the events that arrive meanwhile in `events`."""

    def __init__(self, binary: str, profile: Path, *flags: str) -> None:
        their_in, self._to = (_high(fd) for fd in os.pipe())
        self._from, their_out = (_high(fd) for fd in os.pipe())
        args = [binary, "--headless", "--remote-debugging-pipe", f"--user-data-dir={profile}",
                "--no-first-run", "--no-default-browser-check", "--disable-gpu",
                "--disable-extensions", "--disable-background-networking", "--disable-sync",
                "--metrics-recording-only", "--mute-audio", *flags]
        if os.geteuid() == 0:
            args.append("--no-sandbox")  # Chromium refuses to run its sandbox as root
        # bash (dash takes no descriptor above 9) puts the pipes' ends at 3 and 4, where the
        # browser looks for them
        placed = f'exec "$@" 3<&{their_in} 4>&{their_out} {their_in}<&- {their_out}>&-'
        self._log = Path(profile) / "browser.log"
        with open(self._log, "wb") as log:
            self.process = subprocess.Popen([BASH, "-c", placed, "bash", *args, "about:blank"],
                                            pass_fds=(their_in, their_out),
                                            stdin=subprocess.DEVNULL, stdout=log, stderr=log)
        os.close(their_in)
        os.close(their_out)
        self._buffer = b""
        self._next_id = 0
        self.events: list[dict[str, Any]] = []

    def _send(self, message: dict[str, Any]) -> None:
        data = json.dumps(message).encode() + b"\0"
        while data:
            data = data[os.write(self._to, data):]

    def _receive(self, deadline: float) -> dict[str, Any]:
        while b"\0" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                raise BrowserError("the browser did not answer in time")
            ready, _, _ = select.select([self._from], [], [], left)
            if ready:
                chunk = os.read(self._from, 1 << 16)
                if not chunk:
                    raise BrowserError("the browser closed its pipe: " + self._stderr())
                self._buffer += chunk
        message, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(message)

    def _stderr(self) -> str:
        return self._log.read_text(errors="replace")[-2000:] if self._log.is_file() else ""

    def command(self, method: str, params: dict[str, Any] | None = None,
                session: str | None = None, timeout: float = 30.0) -> dict[str, Any]:
        """Send ``method`` (to the page of ``session``, else to the browser) and return its
        result; events that arrive before the answer go to `events`."""
        self._next_id += 1
        message: dict[str, Any] = {"id": self._next_id, "method": method,
                                   "params": params or {}}
        if session:
            message["sessionId"] = session
        self._send(message)
        deadline = time.monotonic() + timeout
        while True:
            answer = self._receive(deadline)
            if answer.get("id") == self._next_id:
                if "error" in answer:
                    raise BrowserError(f"{method}: {answer['error']}")
                return answer.get("result", {})
            self.events.append(answer)

    def wait_for_event(self, method: str, timeout: float = 30.0) -> dict[str, Any]:
        """The first event ``method`` that has arrived or arrives within ``timeout``."""
        deadline = time.monotonic() + timeout
        while True:
            for event in self.events:
                if event.get("method") == method:
                    return event
            self.events.append(self._receive(deadline))

    def open_page(self) -> str:
        """A new tab, attached: the session id that page commands go to."""
        target = self.command("Target.createTarget", {"url": "about:blank"})["targetId"]
        return self.command("Target.attachToTarget",
                            {"targetId": target, "flatten": True})["sessionId"]

    def evaluate(self, session: str, expression: str) -> Any:
        """``expression``'s value in the page (JSON-able values only)."""
        result = self.command("Runtime.evaluate", {"expression": expression,
                                                   "returnByValue": True,
                                                   "awaitPromise": True}, session)
        if "exceptionDetails" in result:
            raise BrowserError(f"{expression!r}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def close(self) -> None:
        try:
            self.command("Browser.close", timeout=5)
        except (BrowserError, OSError):
            pass
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        for fd in (self._to, self._from):
            os.close(fd)

    def __enter__(self) -> Chromium:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
