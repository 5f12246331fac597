"""Where an ablation row lives on disk, who is running it, and its log.

One process at a time per row: whoever runs a row (``folnet ablate`` itself with ``--jobs 1``,
or the row's own process with ``--jobs N``) holds a `RunLock` on ``OUT/rows/<row>/`` for as
long as it works on the row. The kernel drops the lock when that process dies, so a row whose
lock is held is being worked on by a live process, and a rerun of the ablate reports it
("row X is still running (pid N)") instead of starting it beside that process. The lock is
the ablate's own, on the row directory, apart from any lock the pretraining or finetuning run
may take on its own output directory below it.

Row logs (``OUT/<row>.log``, written by the row processes of ``--jobs N``) are opened for
appending, never truncated: every write lands at the end of the file even when two writers
meet, so no earlier line is lost and no hole of NUL bytes appears; a rerun first appends a line
saying the row was started again.
"""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

from folnet.errors import FolnetError
from folnet.train.ablate.plan import AblationRow
from folnet.train.engine.lock import RunLock, lock_holder

__all__ = ["RowBusy", "claim_row", "open_row_log", "row_dir", "row_holder", "row_log",
           "running_message"]

_CLAIM_TRIES = 5


class RowBusy(FolnetError):
    """The row is being run by another live process; ``holder`` says which (pid, host, ...)."""

    def __init__(self, row: AblationRow, holder: dict[str, object]) -> None:
        super().__init__(running_message(row, holder))
        self.row = row
        self.holder = holder


def row_dir(out: Path, row: AblationRow) -> Path:
    """The directory of one row's runs and result."""
    return out / "rows" / row.slug


def row_log(out: Path, row: AblationRow) -> Path:
    """The log of a row run in its own process (``--jobs N``)."""
    return out / f"{row.slug}.log"


def running_message(row: AblationRow, holder: dict[str, object]) -> str:
    host = holder.get("host")
    where = f" on {host}" if host and host != socket.gethostname() else ""
    return f"row {row.name!r} is still running (pid {holder.get('pid', '?')}{where})"


def claim_row(out: Path, row: AblationRow) -> RunLock:
    """Take the row's lock (release it when done with the row); raises `RowBusy` when a live
    process holds it."""
    directory = row_dir(out, row)
    lock = RunLock(directory, what="ablation row")
    for _ in range(_CLAIM_TRIES):
        try:
            return lock.acquire()
        except FolnetError:
            holder = lock_holder(directory)
            if holder is not None:
                raise RowBusy(row, holder) from None
            # nobody holds it now: another process's `lock_holder` probe held it for an
            # instant (it takes the lock shared to find out); try again
            time.sleep(0.05)
    return lock.acquire()  # still refused: the lock's own message


def row_holder(out: Path, row: AblationRow) -> dict[str, object] | None:
    """Who is running the row now (pid, host, ...), or None. Never call it for a row this
    process holds."""
    return lock_holder(row_dir(out, row))


def open_row_log(out: Path, row: AblationRow) -> int:
    """A file descriptor on the row's log, open for appending (``O_APPEND``: each write goes to
    the end of the file whoever else writes to it). A log that already has lines gets a line
    saying the row was started again, after them."""
    path = row_log(out, row)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o666)
    try:
        size = os.fstat(fd).st_size
        if size:
            with path.open("rb") as fh:
                fh.seek(size - 1)
                newline = b"" if fh.read(1) == b"\n" else b"\n"  # a kill can cut a line
            stamp = time.strftime("%Y-%m-%d %H:%M:%S")
            os.write(fd, newline + f"== {stamp}: row {row.name!r} started again by pid "
                     f"{os.getpid()}; the lines above are from an earlier run\n".encode())
    except BaseException:
        os.close(fd)
        raise
    return fd
