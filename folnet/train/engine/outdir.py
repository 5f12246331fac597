"""What a run may do with its ``--out``: own it, and nothing else.

Three rules, each checked before a run writes its first byte:

1. **The directory is a run's.** ``--out`` that names no directory (``''``), the current
   directory, the home directory, the file-system root or a directory above the current one
   is refused: a run fills OUT with ``.lock``, ``checkpoints/``, ``final/``, logs and a cache,
   and its start-up clean-up works there. An existing directory that is neither empty nor a
   folnet run (`is_run_dir`: one of `RUN_MARKERS` is a regular file in it) is refused too, so a
   mistyped ``--out ~/thesis`` writes nothing and deletes nothing.
2. **No link out.** Any symbolic link inside OUT is refused (`refuse_links`): every file a
   run opens for writing is then inside OUT. (The lock itself is opened with ``O_NOFOLLOW``,
   `folnet.train.engine.lock`.)
3. **A failed start leaves nothing.** `FreshStart` remembers whether OUT was absent or
   empty; if the run fails before its first training step (a corpus without its text column, a
   vocabulary mismatch found after the lock), everything the run wrote is removed again --
   only then, when every entry in OUT is provably the run's own.

The clean-up of killed runs' temporaries (`folnet.atomic_write.remove_leftovers`) deletes only names
folnet's own writers make (a random suffix they end in, `folnet.atomic_write.is_leftover`), never a
user's ``.tmp-notes.txt``.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from types import TracebackType

from folnet.atomic_write import remove_tree
from folnet.errors import FolnetError

__all__ = ["RUN_MARKERS", "FreshStart", "check_out", "is_run_dir", "refuse_links"]

#: Files only a folnet run writes at the top of its directory: the lock every command takes
#: (``.lock``), pretraining's and finetuning's ``run_config.json``, an evaluation's
#: ``eval.json``, an ablation's ``plan.json``.
RUN_MARKERS = (".lock", "run_config.json", "eval.json", "plan.json")


def _is_file(path: Path) -> bool:
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False


def is_run_dir(directory: str | os.PathLike[str]) -> bool:
    """Whether ``directory`` holds one of `RUN_MARKERS` as a regular file (not a link), or is
    an ablation whose seeds hold their locks (``rows/<row>/seed_<s>/.lock``; before seeds were
    the unit, ``rows/<row>/.lock``)."""
    root = Path(directory)
    if any(_is_file(root / name) for name in RUN_MARKERS):
        return True
    rows = root / "rows"
    if rows.is_dir() and not rows.is_symlink():
        return any(_is_file(row / ".lock") or any(_is_file(seed / ".lock")
                                                  for seed in row.glob("seed_*"))
                   for row in rows.iterdir() if row.is_dir() and not row.is_symlink())
    return False


def _forbidden(path: Path) -> str | None:
    """Why ``path`` can never be a run directory, or None."""
    resolved = path.resolve()
    here = Path.cwd().resolve()
    if resolved == Path(resolved.anchor):
        return "is the file-system root"
    if resolved == Path.home().resolve():
        return "is the home directory"
    if resolved == here:
        return "is the current directory"
    if resolved in here.parents:
        return "is a directory above the current one"
    return None


def check_out(out: str | os.PathLike[str] | None, *, option: str = "--out",
              what: str = "run") -> Path:
    """``out`` as a `Path` a run may own, or a `FolnetError` naming why not (rules 1 and 2 of
    the module docstring). Writes nothing."""
    if out is None or not str(out).strip():
        raise FolnetError(f"{option} {str(out or '')!r} names no directory: give the {what} "
                          f"a directory of its own (e.g. {option} runs/NAME)")
    path = Path(os.path.expanduser(str(out)))
    why = _forbidden(path)
    if why is not None:
        raise FolnetError(f"{option} {str(out)!r} {why}: a {what} fills its directory and "
                          f"cleans up in it; give it a directory of its own (e.g. {option} "
                          f"runs/NAME)")
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return path
    except OSError as exc:
        raise FolnetError(f"{option} {str(out)!r} cannot be read ({exc.strerror})") from None
    if stat.S_ISLNK(mode) and not path.is_dir():
        raise FolnetError(f"{option} {str(out)!r} is a link to nothing usable; give a directory")
    if not path.is_dir():
        raise FolnetError(f"{option} {str(out)!r} exists and is not a directory")
    try:
        empty = next(os.scandir(path), None) is None
    except OSError as exc:
        raise FolnetError(f"{option} {str(out)!r} cannot be read ({exc.strerror})") from None
    if not empty and not is_run_dir(path):
        raise FolnetError(f"{option} {str(out)!r} holds files and is not a folnet run (none of "
                          f"{', '.join(RUN_MARKERS)}); folnet writes and cleans up only in "
                          f"its own directories: choose a new or empty {option}")
    refuse_links(path, option=option)
    return path


def refuse_links(out: str | os.PathLike[str], *, option: str = "--out") -> None:
    """Raise `FolnetError` if any entry under ``out`` is a symbolic link: a run writes only
    inside its directory, and a link would carry a write (or a deletion) out of it."""
    root = Path(out)
    if not root.is_dir():
        return
    for current, dirs, files in os.walk(root):  # never descends into a linked directory
        for name in dirs + files:
            entry = Path(current) / name
            if entry.is_symlink():
                raise FolnetError(
                    f"{option} {str(out)!r} contains a symbolic link, {str(entry)!r} -> "
                    f"{os.readlink(entry)!r}; a run never writes through a link out of its "
                    f"directory: remove the link, or choose another {option}")


class FreshStart:
    """``with FreshStart(out) as start: ...; start.begun()`` -- if the block raises before
    `begun` was called and OUT was absent or empty when the block was entered, everything in
    OUT is deleted again (and OUT itself when the run created it): a start that fails leaves
    nothing. A run that resumes an existing directory is never touched."""

    def __init__(self, out: str | os.PathLike[str], *, enabled: bool = True) -> None:
        self.out = Path(out)
        self.enabled = enabled
        self._absent = not self.out.exists()
        self._empty = (not self._absent and self.out.is_dir()
                       and next(os.scandir(self.out), None) is None)
        self._begun = False

    def begun(self) -> None:
        """The run got past its start (its first step is about to run): from here on a failure
        keeps what the run wrote (its log says what happened, checkpoints resume it)."""
        self._begun = True

    def __enter__(self) -> FreshStart:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if (exc_type is None or self._begun or not self.enabled
                or not (self._absent or self._empty)):
            return
        if not self.out.is_dir() or self.out.is_symlink():
            return
        if self._absent:
            remove_tree(self.out)
            return
        for entry in list(self.out.iterdir()):
            remove_tree(entry)
