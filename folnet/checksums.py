"""Per-file checksums of a saved model or checkpoint: ``checksums.json``, verified on load.

Why: safetensors and JSON parsers notice a truncated file, but not a flipped byte inside
tensor data -- the model then loads and silently computes something else. A SHA-256 of every
file, recorded when the directory is written and checked when it is read, turns such damage
(a failing disk, a bad copy) into an error naming the file; ``folnet pretrain --resume`` then
falls back to an older intact checkpoint.

The manifest is written inside the directory's atomic write, after every other file, so a
complete directory always has a manifest that matches it. A file the manifest does not list
is not checked (a tokenizer a user added later, say).

Where a model directory is read (`verify_model_dir`: `folnet.from_pretrained`, the Hugging
Face classes, ``--from``, ``--init-from``) its config, weights *and tokenizer files* are
checked: a tokenizer whose ids were swapped loads without error and silently feeds the model
other tokens. Directories written before manifests existed have none and still load
(checkpoints are a promise), with one warning line per directory saying that nothing could be
checked; under `strict_checksums` (``--strict-checksums``, or ``FOLNET_STRICT_CHECKSUMS=1``)
such a directory is refused instead.
"""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
import os
from collections.abc import Iterable, Iterator
from pathlib import Path, PurePosixPath

from folnet.atomic_write import atomic_write_json, is_leftover, warn
from folnet.errors import FolnetError
from folnet.read_files import read_json

__all__ = ["MANIFEST", "MODEL_FILES", "file_sha256", "read_manifest", "strict_checksums",
           "verify_files", "verify_model_dir", "write_manifest"]

#: What a model directory's reader checks (when the manifest lists them): the model and every
#: tokenizer file the tokenizers and transformers loaders read.
MODEL_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
               "special_tokens_map.json", "vocab.txt", "vocab.json", "merges.txt")

_STRICT: contextvars.ContextVar[bool] = contextvars.ContextVar("folnet_strict_checksums",
                                                               default=False)
_DIGESTS: dict[tuple[object, ...], str] = {}
_WARNED: set[str] = set()  # directories already said to have no manifest (once each)

MANIFEST = "checksums.json"
FORMAT = "folnet-checksums"
_CHUNK = 1 << 20


def file_sha256(path: str | os.PathLike[str]) -> str:
    """The hex SHA-256 of a file, read in 1 MiB chunks (weights may be larger than memory).

    Remembered per (file, size, modification time) within the process: a run checks a model
    directory where it starts and again where it reads the weights, and hashing a base model
    twice would cost ~0.5 s for nothing; any change to the file changes the key."""
    info = os.stat(path)
    key = (os.path.realpath(path), info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns)
    known = _DIGESTS.get(key)
    if known is not None:
        return known
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
    _DIGESTS[key] = digest.hexdigest()
    return _DIGESTS[key]


def write_manifest(directory: str | os.PathLike[str]) -> Path:
    """Record the SHA-256 of every file under `directory` (but the manifest itself and
    temporaries) in ``directory/checksums.json``. Call it after the last file is written."""
    directory = Path(directory)
    files = {}
    for path in sorted(directory.rglob("*")):
        relative = path.relative_to(directory)
        if (path.is_file() and not path.is_symlink() and relative.as_posix() != MANIFEST
                and not any(is_leftover(part) for part in relative.parts)):
            files[relative.as_posix()] = file_sha256(path)
    return atomic_write_json(directory / MANIFEST, {"format": FORMAT, "algorithm": "sha256",
                                                    "files": files})


def read_manifest(directory: str | os.PathLike[str]) -> dict[str, str] | None:
    """``{relative path: sha256}`` of `directory`'s manifest, or None when it has none; a
    damaged manifest is a `FolnetError` naming it."""
    path = Path(directory) / MANIFEST
    if not path.is_file():
        return None
    payload = read_json(path, what="checksum manifest")
    files = payload.get("files") if isinstance(payload, dict) else None
    if (not isinstance(payload, dict) or payload.get("format") != FORMAT
            or payload.get("algorithm") != "sha256" or not isinstance(files, dict)
            or not all(isinstance(k, str) and isinstance(v, str) for k, v in files.items())):
        raise FolnetError(f"{path}: corrupt checksum manifest (expected {{'format': {FORMAT!r}, "
                          f"'algorithm': 'sha256', 'files': {{name: hex digest}}}})")
    for name in files:
        parts = PurePosixPath(name).parts
        if not parts or PurePosixPath(name).is_absolute() or ".." in parts:
            raise FolnetError(f"{path}: corrupt checksum manifest (file name {name!r} is not "
                              f"inside the directory)")
    return files


def verify_files(directory: str | os.PathLike[str], names: Iterable[str] | None = None) -> None:
    """Check the files `names` (default: every file the manifest lists) of `directory` against
    its manifest; a missing or changed file is a `FolnetError` naming it. Nothing is checked
    when there is no manifest, and a name the manifest does not list is skipped."""
    directory = Path(directory)
    manifest = read_manifest(directory)
    if manifest is None:
        return
    for name in manifest if names is None else names:
        want = manifest.get(name)
        if want is None:
            continue
        path = directory / name
        if not path.is_file():
            raise FolnetError(f"{path}: missing, though {directory / MANIFEST} lists it (an "
                              f"incomplete copy?)")
        got = file_sha256(path)
        if got != want.lower():
            raise FolnetError(
                f"{path}: corrupt or truncated: its SHA-256 is {got[:16]}..., not the "
                f"{want[:16]}... recorded in {MANIFEST} when it was written (a disk or copy "
                f"fault; if you changed the file on purpose, delete {MANIFEST})")


@contextlib.contextmanager
def strict_checksums(enabled: bool = True) -> Iterator[None]:
    """Inside, a model directory without ``checksums.json`` is refused rather than loaded with
    a warning (``--strict-checksums``; the environment variable ``FOLNET_STRICT_CHECKSUMS=1``
    does the same everywhere)."""
    token = _STRICT.set(enabled)
    try:
        yield
    finally:
        _STRICT.reset(token)


def _strict() -> bool:
    return _STRICT.get() or os.environ.get("FOLNET_STRICT_CHECKSUMS", "") not in ("", "0")


def verify_model_dir(directory: str | os.PathLike[str]) -> None:
    """Check a model directory's config, weights and tokenizer files (`MODEL_FILES`) against
    its manifest. Without a manifest: one warning line per directory and process, or a
    `FolnetError` under `strict_checksums`."""
    directory = Path(directory)
    if read_manifest(directory) is not None:
        verify_files(directory, MODEL_FILES)
        return
    if _strict():
        raise FolnetError(f"{str(directory)!r} has no {MANIFEST}, so its files cannot be "
                          f"checked, and checksums are strict (--strict-checksums or "
                          f"FOLNET_STRICT_CHECKSUMS); save it again with this folnet, or "
                          f"drop the option to load it unchecked")
    key = str(directory.resolve())
    if key not in _WARNED:
        _WARNED.add(key)
        warn(f"{directory} has no {MANIFEST} (written before folnet recorded checksums, or "
             f"copied without it): its weights and tokenizer are loaded UNCHECKED; "
             f"--strict-checksums refuses such directories")
