"""One process per run directory: an exclusive lock held for the life of a run.

Why `fcntl.flock` on ``OUT/.lock`` and not a pid file: the kernel drops the lock when the
holder dies however it dies (SIGKILL included), so a stale lock from a dead process cannot
exist and needs no detection heuristics; and the lock is on the open file, so a second run in
the same process (a test, a notebook) is refused just like one in another process. The file
also records who holds it (pid, host, start time, command) for the refusal message; that text
is informative only, the lock is the truth.

Limits: advisory (only folnet's own runs take it) and, like every flock, not reliable across
NFS clients on different hosts; the message names the host to help there.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import sys
import time
from pathlib import Path
from types import TracebackType

from folnet.errors import FolnetError

__all__ = ["LOCK_NAME", "RunLock", "lock_holder"]

LOCK_NAME = ".lock"


def _read_holder(path: Path) -> dict[str, object]:
    try:
        holder = json.loads(path.read_text(encoding="utf-8") or "{}")
    except (OSError, ValueError):
        return {}
    return holder if isinstance(holder, dict) else {}


def _describe(holder: dict[str, object]) -> str:
    if not holder:
        return "another process"
    started = holder.get("started")
    when = (time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(started)))
            if isinstance(started, (int, float)) else "?")
    return (f"pid {holder.get('pid', '?')} on {holder.get('host', '?')} since {when} "
            f"({holder.get('command', '?')})")


class RunLock:
    """``with RunLock(out, what="pretraining run"):`` -- the directory is created if needed;
    entering raises `FolnetError` at once (no waiting) when another live run holds it."""

    def __init__(self, directory: str | os.PathLike[str], *, what: str = "run") -> None:
        self.directory = Path(directory)
        self.what = what
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self) -> RunLock:
        if self._fd is not None:
            return self
        self.directory.mkdir(parents=True, exist_ok=True)
        path = self.directory / LOCK_NAME
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise FolnetError(
                f"{str(self.directory)!r} is in use by another {self.what}: "
                f"{_describe(_read_holder(path))}; wait for it to finish, or pass another "
                f"--out") from None
        holder = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.time(),
                  "command": " ".join(os.path.basename(a) if i == 0 else a
                                      for i, a in enumerate(sys.argv))[:300]}
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(holder).encode(), 0)
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        try:
            os.ftruncate(fd, 0)  # no stale holder text for the next reader
        except OSError:
            pass
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.release()


def lock_holder(directory: str | os.PathLike[str]) -> dict[str, object] | None:
    """Who holds ``directory``'s lock (pid, host, started, command), or None when no live
    process does. Takes and drops the lock to find out, so never call it on a directory this
    process holds."""
    path = Path(directory) / LOCK_NAME
    if not path.is_file():
        return None
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return _read_holder(path) or {"pid": "?"}
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)
