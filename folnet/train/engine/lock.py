"""One process per run directory: an exclusive lock held for the life of a run.

Why `fcntl.flock` on ``OUT/.lock`` and not a pid file: the kernel drops the lock when the
holder dies however it dies (SIGKILL included), so a stale lock from a dead process cannot
exist and needs no detection heuristics; and the lock is on the open file, so a second run in
the same process (a test, a notebook) is refused just like one in another process. The file
also records who holds it (pid, host, start time, command) for the refusal message; that text
is informative only, the lock is the truth.

Why the lock is taken after a run has checked its options but before it writes or deletes
anything: a refused run must leave no directory behind, and the start-up clean-up of what
killed runs left (``on_acquire``, `remove_leftovers`) must run only when no live run
can be writing those temporaries. Under ``torchrun`` only rank 0 takes it (``enabled``): the
other ranks write nothing in OUT that rank 0 does not coordinate.

Limits: advisory (only folnet's own runs take it) and, like every flock, not reliable across
NFS clients on different hosts; the message names the host to help there.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
import stat
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType

from folnet.atomic_write import write_error
from folnet.errors import FolnetError

__all__ = ["LOCK_NAME", "RunLock", "lock_holder"]

LOCK_NAME = ".lock"


def _read_holder(path: Path) -> dict[str, object]:
    try:
        holder = json.loads(path.read_text(encoding="utf-8") or "{}")
    except (OSError, ValueError):
        return {}
    return holder if isinstance(holder, dict) else {}


def _describe(holder: dict[str, object], what: str) -> str:
    if not holder:
        return f"another {what}"
    started = holder.get("started")
    when = (time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(started)))
            if isinstance(started, (int, float)) else "?")
    return (f"another {holder.get('what') or what}: pid {holder.get('pid', '?')} on "
            f"{holder.get('host', '?')} since {when} ({holder.get('command', '?')})")


def _not_a_lock(path: Path, what: str) -> FolnetError:
    return FolnetError(f"{str(path)!r} is {what}, not folnet's lock file; folnet never writes "
                       f"through it: delete it, or choose another --out")


class RunLock:
    """``with RunLock(out, what="pretraining run"):`` -- the directory is created if needed;
    entering raises `FolnetError` at once (no waiting) when another live run holds it, and a
    directory that cannot be written is a `folnet.atomic_write.WriteError` naming it.

    ``on_acquire(directory)`` runs once the lock is held (the clean-up of dead runs'
    leftovers); if it fails the lock is released. ``enabled=False`` makes the lock a no-op
    (the ranks of a distributed run other than rank 0). `acquire` is idempotent, so a run may
    take the lock early (before reading an existing directory) and "again" where it would
    first create one.
    """

    def __init__(self, directory: str | os.PathLike[str], *, what: str = "run",
                 enabled: bool = True,
                 on_acquire: Callable[[Path], object] | None = None) -> None:
        self.directory = Path(directory)
        self.what = what
        self.enabled = enabled
        self.on_acquire = on_acquire
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self) -> RunLock:
        if self._fd is not None or not self.enabled:
            return self
        path = self.directory / LOCK_NAME
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            # O_NOFOLLOW: a link planted at OUT/.lock must not have the truncation below
            # land on the file it points to (outside OUT)
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW
                         | os.O_NONBLOCK, 0o666)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise _not_a_lock(path, "a symbolic link") from None
            raise write_error(path, exc, what=f"cannot create the {self.what}'s lock file"
                              ) from None
        if not stat.S_ISREG(os.fstat(fd).st_mode):  # a FIFO or a device: not ours either
            os.close(fd)
            raise _not_a_lock(path, "not a regular file")
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise FolnetError(
                f"{str(self.directory)!r} is in use by "
                f"{_describe(_read_holder(path), self.what)}; wait for it to finish, or pass "
                f"another --out") from None
        holder = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.time(),
                  "what": self.what,
                  "command": " ".join(os.path.basename(a) if i == 0 else a
                                      for i, a in enumerate(sys.argv))[:300]}
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, json.dumps(holder).encode(), 0)
        except OSError:
            pass  # the holder text is informative only (a full disk must not stop the lock)
        self._fd = fd
        if self.on_acquire is not None:
            try:
                self.on_acquire(self.directory)
            except BaseException:
                self.release()
                raise
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
    if not path.is_file() or path.is_symlink():
        return None
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return _read_holder(path) or {"pid": "?"}
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)
