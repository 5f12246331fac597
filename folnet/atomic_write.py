"""Atomic writes of files and of whole directories: write beside the target, fsync, rename over.

A crash (or SIGKILL, or a full disk) mid-write leaves the previous version intact: readers see
the old file or directory or the new one, never half of one. Temporaries are named
``.tmp-<name>-...`` and directories being deleted ``.trash-<name>-...`` so that a reader can
skip, and the next run in the directory delete (`remove_leftovers`), whatever a crash left.

Why temporaries are created with ``os.open(..., 0o666)`` and not `tempfile.mkstemp`: mkstemp
makes every file 0600 whatever the umask, so weights and configs written through here could
not be read by a colleague on a shared disk although the user's umask says they may. A file
created with mode 0666 gets exactly the permissions a plain ``open(path, "w")`` would give
(0644 under umask 022); directories likewise (``mkdir`` with 0777 minus the umask).

Why a failed write is a `WriteError`: a full disk, a read-only folder or a missing permission
is the user's to fix, so it must reach them as one line naming the file (the CLI prints a
`FolnetError` that way), not as a traceback; and since it is also an `OSError`, code that
already catches OSError keeps working.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import shutil
import stat
import sys
import uuid
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from folnet.errors import FolnetError

__all__ = ["WriteError", "atomic_write", "atomic_write_dir", "atomic_write_json",
           "atomic_write_text", "discard_dir", "fsync_dir", "fsync_tree", "is_leftover",
           "os_error_of", "remove_leftovers", "remove_tree", "warn", "write_error",
           "write_faults", "writing"]


#: The OS errors a user fixes on their side, with what to tell them.
WRITE_FAULTS = {
    errno.ENOSPC: "the disk is full: free some space and run again",
    errno.EDQUOT: "the disk quota is used up: free some space and run again",
    errno.EROFS: "choose a folder on a writable file system",
    errno.EACCES: "check the folder's permissions, or choose another folder",
    errno.EPERM: "check the folder's permissions, or choose another folder",
    errno.EFBIG: "the file system or the process's file-size limit allows no file this large",
}

_RUST_OS_ERROR = re.compile(r"os error (\d+)")


class WriteError(FolnetError, OSError):
    """A file or directory could not be written: a `FolnetError` naming it (``path``) and the
    reason (``reason``), and an `OSError` whose ``errno`` is the underlying one."""

    path: str = ""
    reason: str = ""


def warn(text: str) -> None:
    """One line on stderr for something the user should know but that does not stop the run."""
    print(f"folnet: warning: {text}", file=sys.stderr, flush=True)


def os_error_of(exc: BaseException) -> OSError | None:
    """The OS error behind `exc`: `exc` itself, one it was raised from or while handling
    (``torch.save`` to a file object reports a failed write as a RuntimeError raised while
    handling the OSError), or one a Rust library reports as text (safetensors: ``... (os
    error 28)``). A `FolnetError` is never taken for one: it already says what went wrong."""
    if isinstance(exc, FolnetError) and not isinstance(exc, OSError):
        return None
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, OSError):
            return current
        seen.add(id(current))
        current = current.__cause__ or (None if current.__suppress_context__
                                         else current.__context__)
    match = _RUST_OS_ERROR.search(str(exc))
    if match:
        number = int(match.group(1))
        return OSError(number, os.strerror(number))
    return None


def _reason(err: OSError) -> str:
    """``No space left on device [ENOSPC] (the disk is full: ...)``."""
    if isinstance(err, WriteError):
        return err.reason
    text = err.strerror or str(err) or type(err).__name__
    name = errno.errorcode.get(err.errno) if err.errno is not None else None
    if name is None:
        return text
    hint = WRITE_FAULTS.get(err.errno)
    return f"{text} [{name}]" + (f" ({hint})" if hint else "")


def write_error(path: str | os.PathLike[str], err: OSError, *, what: str = "cannot write",
                kept: str = "") -> WriteError:
    """A `WriteError` saying `what` failed on `path`, why (`err`) and, when given, what was
    `kept` as it was."""
    reason = _reason(err)
    error = WriteError(f"{what} {path}: {reason}" + (f"; {kept}" if kept else ""))
    error.errno, error.path, error.reason = err.errno, str(path), reason
    return error


@contextlib.contextmanager
def write_faults(where: str | os.PathLike[str] | None = None) -> Iterator[None]:
    """Turn the OS faults a user fixes (`WRITE_FAULTS`: full disk, read-only folder, missing
    permission) raised inside into a `WriteError` naming the file, or `where` (the folder being
    written) when the error names none; anything else passes unchanged."""
    try:
        yield
    except FolnetError:
        raise
    except Exception as exc:
        err = os_error_of(exc)
        if err is None or err.errno not in WRITE_FAULTS:
            raise
        if err.filename is not None:
            raise write_error(err.filename, err, what="cannot access") from exc
        raise write_error(where if where is not None else "a file", err,
                          what="cannot write in" if where is not None else "cannot write"
                          ) from exc


def fsync_dir(directory: str | os.PathLike[str]) -> None:
    """Flush a directory's entries (a rename into it, say) to disk."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:  # pragma: no cover - platforms without directory fds
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(directory: str | os.PathLike[str]) -> None:
    """Flush every file under ``directory``, then the directories themselves, deepest first."""
    directory = Path(directory)
    for path in sorted(directory.rglob("*"), reverse=True):
        if path.is_file():
            with open(path, "rb") as handle:
                os.fsync(handle.fileno())
        elif path.is_dir():
            fsync_dir(path)
    fsync_dir(directory)


def _temporary_name(path: Path) -> Path:
    return path.parent / f".tmp-{path.name}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


def atomic_write(path: str | Path, write: Callable[[Path], None]) -> Path:
    """Call ``write(tmp_path)`` then move the result onto ``path`` atomically.

    The temporary is created empty (mode 0666 minus the umask, as a plain open() would) for
    `write` to fill by name; a writer that replaces the file (safetensors makes it 0600) gets
    that mode back. An OS fault is a `WriteError` naming ``path``; the previous
    version of ``path`` is then untouched.
    """
    path = Path(path)
    tmp: Path | None = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = _temporary_name(path)
        os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666))
        mode = stat.S_IMODE(os.stat(tmp).st_mode)  # 0666 minus the umask
        write(tmp)
        if stat.S_IMODE(os.stat(tmp).st_mode) != mode:  # a writer that makes its own file
            os.chmod(tmp, mode)                       # (safetensors: 0600)
        with open(tmp, "rb+") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, path)
        tmp = None
        fsync_dir(path.parent)
    except Exception as exc:
        err = os_error_of(exc)
        if err is None:
            raise
        raise write_error(path, err, kept="its previous version, if any, is unchanged"
                          ) from exc
    finally:
        if tmp is not None:
            with contextlib.suppress(OSError):
                tmp.unlink()
    return path


def atomic_write_text(path: str | Path, text: str) -> Path:
    return atomic_write(path, lambda p: p.write_text(text, encoding="utf-8"))


def atomic_write_json(path: str | Path, payload: object) -> Path:
    return atomic_write_text(path, json.dumps(payload, indent=2, sort_keys=True) + "\n")


def _make_writable(root: Path) -> None:
    """Give the owner write access to every directory under `root` (deleting a file needs
    write access to its directory); directories of other owners are left as they are."""
    for directory in [root, *(p for p in root.rglob("*") if p.is_dir() and not p.is_symlink())]:
        with contextlib.suppress(OSError):
            mode = directory.lstat().st_mode
            os.chmod(directory, stat.S_IMODE(mode) | stat.S_IRWXU)


@contextlib.contextmanager
def writing(path: str | os.PathLike[str]) -> Iterator[None]:
    """Name `path` in the `WriteError` of an OS fault raised inside: a write to an open file
    (``torch.save`` into a handle) fails with an OSError that names no file."""
    try:
        yield
    except Exception as exc:
        err = os_error_of(exc)
        if err is None or isinstance(exc, WriteError):
            raise
        raise write_error(path, err) from exc


def remove_tree(path: str | os.PathLike[str]) -> OSError | None:
    """Delete a file or a directory tree, read-only directories included when they are ours.
    Returns the error that stopped it, or None when `path` is gone.

    Only for what is already garbage (temporaries, trash): making a directory writable to
    empty it would defeat a user's protection of anything else.
    """
    path = Path(path)
    if not path.is_dir() or path.is_symlink():
        try:
            path.unlink(missing_ok=True)
        except OSError as exc:
            return exc
        return None
    try:
        shutil.rmtree(path)
        return None
    except FileNotFoundError:
        return None
    except OSError:
        _make_writable(path)
    try:
        shutil.rmtree(path)
    except FileNotFoundError:
        return None
    except OSError as exc:
        return exc
    return None


def _removal_failed(path: Path, err: OSError) -> None:
    warn(f"could not delete {path} ({_reason(err)}); the next run in this directory tries "
         f"again, or delete it by hand")


def discard_dir(path: str | os.PathLike[str]) -> bool:
    """Delete a directory by first renaming it aside, so that a deletion cut short never
    leaves a half-empty directory under the original name. Returns whether it is all gone; a
    trash directory that cannot be emptied (say, files of another user) is left for
    `remove_leftovers` with a warning line."""
    path = Path(path)
    trash = path.parent / f".trash-{path.name}-{uuid.uuid4().hex[:8]}"
    try:
        os.replace(path, trash)
    except OSError as exc:
        raise write_error(path, exc, what="cannot delete") from exc
    err = remove_tree(trash)
    if err is not None:
        _removal_failed(trash, err)
        return False
    return True


#: The names folnet's writers give what an interruption may leave: a temporary
#: (``.tmp-<name>-<pid>-<8 hex>``, `_temporary_name`), a directory being deleted
#: (``.trash-<name>-<8 hex>``, `discard_dir`), and the mkstemp temporaries of earlier
#: folnet versions (``.<name>.<8 of [a-z0-9_]>.tmp``). The random suffix is what proves a name
#: folnet's own: a user's ``.tmp-draft.txt`` or ``.session.vim.tmp`` never matches.
_LEFTOVER = re.compile(r"\.tmp-.+-\d+-[0-9a-f]{8}|\.trash-.+-[0-9a-f]{8}|\..+\.[a-z0-9_]{8}\.tmp")


def is_leftover(name: str) -> bool:
    """Whether a directory entry is what one of folnet's interrupted atomic writes or
    deletions left (see `_LEFTOVER`); anything else, whatever it looks like, is not."""
    return _LEFTOVER.fullmatch(name) is not None


def remove_leftovers(root: str | os.PathLike[str], *, skip: Iterable[str] = ("cache",)
                     ) -> list[Path]:
    """Delete the temporaries and trash interrupted writes left anywhere under `root`, not
    descending into the directories named in `skip` (a dataset cache is shared between runs
    and manages its own). Returns what could not be deleted (each said in a warning line).

    Call it only while holding the directory's `folnet.train.engine.lock.RunLock`: a live
    run's temporaries look exactly like a dead one's.
    """
    root = Path(root)
    stuck: list[Path] = []
    if not root.is_dir():
        return stuck
    skipped = set(skip)
    for current, dirs, files in os.walk(root):
        for name in [d for d in dirs if is_leftover(d)] + [f for f in files if is_leftover(f)]:
            target = Path(current) / name
            err = remove_tree(target)
            if err is not None:
                _removal_failed(target, err)
                stuck.append(target)
        dirs[:] = [d for d in dirs if not is_leftover(d) and not (Path(current) == root
                                                                   and d in skipped)]
    return stuck


def atomic_write_dir(path: str | os.PathLike[str], write: Callable[[Path], None], *,
                     replace: bool = True) -> Path:
    """Call ``write(tmp_dir)`` on a fresh sibling directory, fsync it and rename it to ``path``.

    An existing ``path`` is replaced when ``replace`` (renamed aside first, then deleted);
    otherwise it is kept and the new copy dropped -- right for a cache entry that another
    process may have finished first. Whatever ``write`` raises, the temporary is removed and
    ``path`` is left as it was; an OS fault (full disk, read-only folder) is a `WriteError`
    naming ``path`` and the file inside it that failed.
    """
    path = Path(path)
    tmp = _temporary_name(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.mkdir()
        write(tmp)
        fsync_tree(tmp)
        if path.exists():
            if not replace:
                remove_tree(tmp)
                return path
            discard_dir(path)
        try:
            os.replace(tmp, path)
        except OSError:
            if replace or not path.exists():
                raise
            remove_tree(tmp)  # another process finished it first
            return path
        fsync_dir(path.parent)
    except BaseException as exc:
        remove_tree(tmp)
        err = os_error_of(exc) if isinstance(exc, Exception) else None
        if err is None:
            raise
        inner = _inside(err.path if isinstance(err, WriteError) else err.filename, tmp)
        raise write_error(f"{path}{f' ({inner})' if inner else ''}", err,
                          kept="nothing of it was kept and what was there before is "
                               "unchanged") from exc
    return path


def _inside(name: object, tmp: Path) -> str | None:
    """`name` relative to the directory being written, when it lies inside."""
    if not name:
        return None
    try:
        return str(Path(str(name)).relative_to(tmp))
    except ValueError:
        return None
