"""Where an ablation row lives on disk, who is running each of its seeds, and its log.

One process at a time per seed of a row: whoever runs a seed (``folnet ablate`` itself with
``--jobs 1``, or the seed's own process with ``--jobs N``) holds a `RunLock` on
``OUT/rows/<row>/seed_<s>/`` for as long as it works on that seed. The kernel drops the lock
when that process dies, so a seed whose lock is held is being worked on by a live process, and
a rerun of the ablate reports it ("row X seed S is still running (pid N)") instead of starting
it beside that process. The lock is the ablate's own, on the seed directory, apart from any
lock the pretraining or finetuning run may take on its own output directory below it. Seeds,
not rows, are the unit of work: ``--jobs N`` keeps N processes busy on any row's seeds, so a
plan whose rows differ in cost does not leave a core idle while its slowest row finishes.

Row logs (``OUT/<row>.log``, written by the seed processes of ``--jobs N``) are opened for
appending, never truncated: every write lands at the end of the file even when two writers
meet (two seeds of a row at once, or a process left from a killed run), so no earlier line is
lost and no hole of NUL bytes appears; each seed process first appends a line saying which
seed it starts, and a seed started again says so.
"""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

from folnet.errors import FolnetError
from folnet.train.ablate.plan import AblationRow
from folnet.train.engine.lock import RunLock, lock_holder

__all__ = ["RowBusy", "claim_seed", "open_row_log", "row_dir", "row_log", "running_message",
           "seed_dir", "seed_holder"]

_CLAIM_TRIES = 5


class RowBusy(FolnetError):
    """Seeds of the row are being run by other live processes; ``holders`` says which (seed ->
    pid, host, ...)."""

    def __init__(self, row: AblationRow, holders: dict[int, dict[str, object]]) -> None:
        super().__init__("; ".join(running_message(row, s, h) for s, h in holders.items()))
        self.row = row
        self.holders = holders


def row_dir(out: Path, row: AblationRow) -> Path:
    """The directory of one row's runs and result."""
    return out / "rows" / row.slug


def row_log(out: Path, row: AblationRow) -> Path:
    """The log of a row run in its own process (``--jobs N``)."""
    return out / f"{row.slug}.log"


def seed_dir(out: Path, row: AblationRow, seed: int) -> Path:
    """The directory of one seed of one row."""
    return row_dir(out, row) / f"seed_{seed}"


def running_message(row: AblationRow, seed: int, holder: dict[str, object]) -> str:
    host = holder.get("host")
    where = f" on {host}" if host and host != socket.gethostname() else ""
    return f"row {row.name!r} seed {seed} is still running (pid {holder.get('pid', '?')}{where})"


def claim_seed(out: Path, row: AblationRow, seed: int) -> RunLock:
    """Take the lock of one seed of the row (release it when done with the seed); raises
    `RowBusy` when a live process holds it."""
    directory = seed_dir(out, row, seed)
    lock = RunLock(directory, what="ablation seed")
    for _ in range(_CLAIM_TRIES):
        try:
            return lock.acquire()
        except FolnetError:
            holder = lock_holder(directory)
            if holder is not None:
                raise RowBusy(row, {seed: holder}) from None
            # nobody holds it now: another process's `lock_holder` probe held it for an
            # instant (it takes the lock shared to find out); try again
            time.sleep(0.05)
    return lock.acquire()  # still refused: the lock's own message


def seed_holder(out: Path, row: AblationRow, seed: int) -> dict[str, object] | None:
    """Who is running the seed now (pid, host, ...), or None. Never call it for a seed this
    process holds."""
    return lock_holder(seed_dir(out, row, seed))


def open_row_log(out: Path, row: AblationRow, seed: int) -> int:
    """A file descriptor on the row's log, open for appending (``O_APPEND``: each write goes to
    the end of the file whoever else writes to it), after a line saying which seed starts (a
    seed with lines of its own in the log above: started again)."""
    path = row_log(out, row)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o666)
    try:
        size = os.fstat(fd).st_size
        newline, again = b"", False
        if size:
            with path.open("rb") as fh:
                data = fh.read(size)
            newline = b"" if data.endswith(b"\n") else b"\n"  # a kill can cut a line
            again = f"[{row.name}] seed {seed}".encode() in data
        stamp = time.strftime("%Y-%m-%d %H:%M:%S")
        said = (f"started again by ablate pid {os.getpid()}; its lines above are from an earlier "
                f"run" if again else f"started by ablate pid {os.getpid()}")
        os.write(fd, newline + f"== {stamp}: row {row.name!r} seed {seed} {said}\n".encode())
    except BaseException:
        os.close(fd)
        raise
    return fd
