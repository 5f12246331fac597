"""Atomic writes of files and of whole directories: write beside the target, fsync, rename over.

A crash (or SIGKILL, or a full disk) mid-write leaves the previous version intact: readers see
the old file or directory or the new one, never half of one. Temporaries are named
``.tmp-<name>-...`` and directories being deleted ``.trash-<name>-...`` so that a reader can
skip, and a later run delete, whatever a crash left behind.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import uuid
from collections.abc import Callable
from pathlib import Path

__all__ = ["atomic_write", "atomic_write_dir", "atomic_write_json", "atomic_write_text",
           "discard_dir", "fsync_dir", "fsync_tree"]


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


def atomic_write(path: str | Path, write: Callable[[Path], None]) -> Path:
    """Call ``write(tmp_path)`` then move the result onto ``path`` atomically."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        write(tmp_path)
        with open(tmp_path, "rb+") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp_path, path)
        fsync_dir(path.parent)
    finally:
        if tmp_path.exists():
            tmp_path.unlink()
    return path


def atomic_write_text(path: str | Path, text: str) -> Path:
    return atomic_write(path, lambda p: p.write_text(text, encoding="utf-8"))


def atomic_write_json(path: str | Path, payload: object) -> Path:
    return atomic_write_text(path, json.dumps(payload, indent=2, sort_keys=True) + "\n")


def discard_dir(path: str | os.PathLike[str]) -> None:
    """Delete a directory by first renaming it aside, so that a deletion cut short never
    leaves a half-empty directory under the original name."""
    path = Path(path)
    trash = path.parent / f".trash-{path.name}-{uuid.uuid4().hex[:8]}"
    os.replace(path, trash)
    shutil.rmtree(trash, ignore_errors=True)


def atomic_write_dir(path: str | os.PathLike[str], write: Callable[[Path], None], *,
                     replace: bool = True) -> Path:
    """Call ``write(tmp_dir)`` on a fresh sibling directory, fsync it and rename it to ``path``.

    An existing ``path`` is replaced when ``replace`` (renamed aside first, then deleted);
    otherwise it is kept and the new copy dropped -- right for a cache entry that another
    process may have finished first. Whatever ``write`` raises, the temporary is removed and
    ``path`` is left as it was.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".tmp-{path.name}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        write(tmp)
        fsync_tree(tmp)
        if path.exists():
            if not replace:
                shutil.rmtree(tmp, ignore_errors=True)
                return path
            discard_dir(path)
        try:
            os.replace(tmp, path)
        except OSError:
            if replace or not path.exists():
                raise
            shutil.rmtree(tmp, ignore_errors=True)  # another process finished it first
            return path
        fsync_dir(path.parent)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return path
