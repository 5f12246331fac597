"""Per-file checksums of a saved model or checkpoint: ``checksums.json``, verified on load.

Why: safetensors and JSON parsers notice a truncated file, but not a flipped byte inside
tensor data -- the model then loads and silently computes something else. A SHA-256 of every
file, recorded when the directory is written and checked when it is read, turns such damage
(a failing disk, a bad copy) into an error naming the file; ``folnet pretrain --resume`` then
falls back to an older intact checkpoint.

The manifest is written inside the directory's atomic write, after every other file, so a
complete directory always has a manifest that matches it. A file the manifest does not list
is not checked (a tokenizer a user added later, say).

A listed file that differs is told apart by its modification time, and the message says which:
- no newer than the manifest: damage (a disk or copy fault), an error;
- newer: rewritten after the save. A tokenizer's ``save_pretrained`` into the model's folder,
  an everyday habit, rewrites its files in another form. The manifest also records the
  tokenizer's fingerprint (what decides the ids a text maps to); a rewritten tokenizer file
  whose directory still gives that fingerprint loads with a warning. The manifest records
  each safetensors file's header (tensor names, shapes and offsets) too: a newer weights file
  with another header that is a complete safetensors file (`safetensors_header`) is what
  another library's save leaves, and loads UNVERIFIED with a warning (refused under
  `strict_checksums`); one whose header is the recorded one but whose bytes differ was damaged
  in place (a flipped or overwritten byte) and is refused as corrupt. Any other rewritten file
  (config, a tokenizer with other ids, a broken weights file) is an error saying how to record
  it again (`write_model_manifest`).

What is listed is decided where the directory is written, and what is checked is read from the
manifest: where a model directory is read (`verify_model_dir`: `folnet.from_pretrained`, the
Hugging Face classes, ``--from``, ``--init-from``) *every* file its manifest lists is checked --
config, weights, tokenizer files (a tokenizer whose ids were swapped loads without error and
silently feeds the model other tokens), a checkpoint's trainer state. Why no list of names on
the reading side: a name missing from such a list went unnoticed, and an edited ``vocab.txt``
of a published model then loaded silently. Directories folnet owns (a checkpoint, ``final/``, a
finetuned ``model/``) list every file (`write_manifest`); a ``save_pretrained`` into a folder
the model may share with other things (a Trainer's ``output_dir`` with its ``checkpoint-N/``
and logs, a user's work folder) lists its model and tokenizer files only
(`write_model_manifest`), so a log that grows later is not taken for damage.

Directories written before manifests existed have none and still load (checkpoints are a
promise), with one warning line per directory saying that nothing could be checked; under
`strict_checksums` (``--strict-checksums``, or ``FOLNET_STRICT_CHECKSUMS=1``) such a directory
is refused instead.
"""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
import json
import os
import re
from collections.abc import Iterable, Iterator
from pathlib import Path, PurePosixPath

from folnet.atomic_write import atomic_write_json, is_leftover, warn
from folnet.errors import FolnetError
from folnet.read_files import read_json

__all__ = ["MANIFEST", "MANIFEST_PROMISE", "MODEL_FILES", "TOKENIZER_FILES", "file_sha256",
           "model_files", "read_manifest", "strict_checksums", "verify_files", "verify_model_dir",
           "write_manifest", "write_model_manifest"]

#: The files of a model directory that `write_model_manifest` records when present: what the
#: folnet, transformers and tokenizers loaders read (weights shards too, by `_SHARD`). Only the
#: writer into a shared folder uses it; the readers check whatever the manifest lists.
MODEL_FILES = ("config.json", "generation_config.json", "model.safetensors",
               "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json",
               "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
               "added_tokens.json", "vocab.txt", "vocab.json", "merges.txt", "tokenizer.model")
#: The tokenizer's files: one rewritten after the save loads if the tokenizer still has the
#: fingerprint the manifest records (`verify_files`).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "added_tokens.json", "vocab.txt", "vocab.json", "merges.txt",
                   "tokenizer.model")
_SHARD = re.compile(r"^(model|pytorch_model)-\d+-of-\d+\.(safetensors|bin)$")

_STRICT: contextvars.ContextVar[bool] = contextvars.ContextVar("folnet_strict_checksums",
                                                               default=False)
_DIGESTS: dict[tuple[object, ...], str] = {}
_WARNED: set[str] = set()  # files and directories already warned about (`_warn_once`)

MANIFEST = "checksums.json"
#: The config.json key by which a model directory says folnet wrote its manifest.
MANIFEST_PROMISE = "manifest"
FORMAT = "folnet-checksums"
_CHUNK = 1 << 20


def file_sha256(path: str | os.PathLike[str]) -> str:
    """The hex SHA-256 of a file, read in 1 MiB chunks (weights may be larger than memory).

    Remembered per (file, size, modification time) within the process: a run checks a model
    directory where it starts and again where it reads the weights, and hashing a base model
    twice would cost time for nothing (docs/results/measurements.md); any change to the file
    changes the key."""
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


def write_manifest(directory: str | os.PathLike[str],
                   names: Iterable[str] | None = None) -> Path:
    """Record the SHA-256 of every file under `directory` (but the manifest itself and
    temporaries) in ``directory/checksums.json``, or of just the files `names` (relative
    paths; a name that is not a regular file is left out). Call it after the last file is
    written: a file written afterwards is not listed, and a listed one changed afterwards is
    taken for damage."""
    directory = Path(directory)
    if names is None:
        found = (p.relative_to(directory) for p in directory.rglob("*"))
    else:
        found = (PurePosixPath(name) for name in names)
    files = {}
    for relative in sorted(found, key=lambda r: r.as_posix()):
        path = directory / relative
        if (path.is_file() and not path.is_symlink() and relative.as_posix() != MANIFEST
                and not any(is_leftover(part) for part in relative.parts)):
            files[relative.as_posix()] = file_sha256(path)
    payload = {"format": FORMAT, "algorithm": "sha256", "files": files}
    headers = {name: hashlib.sha256(header).hexdigest() for name in files
               if name.endswith(".safetensors")
               and (header := safetensors_header(directory / name)) is not None}
    if headers:  # absent from manifests written before it: those files are checked whole
        payload["headers"] = headers
    fingerprint = _tokenizer_fingerprint(directory) if set(files) & set(TOKENIZER_FILES) else None
    if fingerprint is not None:
        payload["tokenizer"] = fingerprint
    return atomic_write_json(directory / MANIFEST, payload)


def _tokenizer_fingerprint(directory: Path) -> str | None:
    """The fingerprint of the tokenizer saved in `directory`
    (`folnet.train.data.tokenizer.FolnetTokenizer.fingerprint`), or None when there is none
    folnet reads (or the train extra, which reads it, is not installed)."""
    try:
        from folnet.train.data.tokenizer import load_tokenizer

        return load_tokenizer(directory).fingerprint
    except (ImportError, FolnetError, OSError, ValueError):
        return None


def model_files(directory: str | os.PathLike[str]) -> list[str]:
    """The model and tokenizer files at the top of `directory`: `MODEL_FILES` and weight
    shards, whichever are there."""
    directory = Path(directory)
    return sorted(entry.name for entry in directory.iterdir()
                  if (entry.name in MODEL_FILES or _SHARD.match(entry.name))
                  and entry.is_file() and not entry.is_symlink())


def write_model_manifest(directory: str | os.PathLike[str]) -> Path:
    """The manifest of a model directory written by a ``save_pretrained`` (transformers' save
    path of the `folnet.hf` classes): its model and tokenizer files (`model_files`), those
    written before it (a tokenizer saved first) included, and nothing else in the folder (a
    Trainer's ``checkpoint-N/``, logs, a user's notes). Call it after the weights and config
    are written; ``from_pretrained`` then checks those files instead of warning that the
    directory has no manifest."""
    return write_manifest(directory, model_files(directory))


def read_manifest(directory: str | os.PathLike[str]) -> dict[str, str] | None:
    """``{relative path: sha256}`` of `directory`'s manifest, or None when it has none; a
    damaged manifest is a `FolnetError` naming it."""
    payload = _payload(directory)
    return None if payload is None else payload["files"]


def _payload(directory: str | os.PathLike[str]) -> dict | None:
    """The manifest as read and checked (`read_manifest`), all its fields."""
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
    return payload


def verify_files(directory: str | os.PathLike[str], names: Iterable[str] | None = None) -> None:
    """Check the files `names` (default: every file the manifest lists) of `directory` against
    its manifest; a missing or changed file is a `FolnetError` naming it. Nothing is checked
    when there is no manifest, and a name the manifest does not list is skipped."""
    directory = Path(directory)
    payload = _payload(directory)
    if payload is None:
        return
    manifest = payload["files"]
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
            headers = payload.get("headers")
            _changed(directory, name, got, want, payload.get("tokenizer"),
                     headers.get(name) if isinstance(headers, dict) else None)


def _changed(directory: Path, name: str, got: str, want: str, recorded: str | None,
             header: str | None = None) -> None:
    """A listed file that differs from its record: damage, or a rewrite after the save (see
    the module docstring); raises, or warns once for a tokenizer that means what it did and
    for weights another save rewrote (``header``: the digest of the safetensors header the
    manifest recorded)."""
    path = directory / name
    differs = (f"its SHA-256 is {got[:16]}..., not the {want[:16]}... recorded in {MANIFEST} "
               f"when it was written")
    again = (f"if the change is meant, folnet.checksums.write_model_manifest("
             f"{str(directory)!r}) records the folder as it is")
    if path.stat().st_mtime_ns <= (directory / MANIFEST).stat().st_mtime_ns:
        raise FolnetError(f"{path}: corrupt or truncated: {differs}, and it is no newer than "
                          f"{MANIFEST} (a disk or copy fault; {again})")
    if name in TOKENIZER_FILES and recorded is not None:
        now = _tokenizer_fingerprint(directory)
        if now == recorded:
            _warn_once(path, f"{path} was rewritten after folnet saved {directory} (a "
                             f"tokenizer's save_pretrained does this); the tokenizer still maps "
                             f"text to the ids it did (fingerprint {recorded}), so it is "
                             f"loaded; {again}")
            return
        raise FolnetError(f"{path}: rewritten after folnet saved {directory}, and the tokenizer "
                          f"no longer maps text to the ids the model learnt: fingerprint "
                          f"{now}, not the {recorded} recorded in {MANIFEST} (a corrupt or "
                          f"swapped vocabulary; {again})")
    now = safetensors_header(path) if header is not None else None
    if now is not None and hashlib.sha256(now).hexdigest() == header.lower():
        raise FolnetError(f"{path}: corrupt or truncated: {differs}, under the very header "
                          f"folnet wrote (the tensor data changed in place: a flipped or "
                          f"overwritten byte, or the same tensors saved again with other "
                          f"values; {again})")
    if now is not None and not _strict():
        _warn_once(path, f"{path} was rewritten after folnet saved {directory} ({differs}): "
                         f"a complete safetensors file with other tensors or layout than the "
                         f"recorded header (another library's save), so it is loaded "
                         f"UNVERIFIED; --strict-checksums refuses it; {again}")
        return
    raise FolnetError(f"{path}: corrupt or truncated, or rewritten: {differs}, and it is newer "
                      f"than {MANIFEST} (changed after the save, or copied without its times; "
                      f"{again})")


def safetensors_header(path: Path) -> bytes | None:
    """The header of a whole safetensors file ``path`` (its 8-byte length and JSON), or None
    for a file that is not one: the JSON broken, or tensor data that does not end exactly at
    the end of the file (truncated or padded). A flipped byte inside the data is not seen
    here -- that is what the manifest's hash of the whole file is for."""
    size = path.stat().st_size
    try:
        with path.open("rb") as f:
            head = f.read(8)
            n = int.from_bytes(head, "little")
            if len(head) < 8 or not 2 <= n <= min(size - 8, 100 * 2**20):
                return None
            text = f.read(n)
            header = json.loads(text)
    except (OSError, ValueError):
        return None
    if not isinstance(header, dict):
        return None
    try:
        ends = [int(t["data_offsets"][1]) for k, t in header.items() if k != "__metadata__"]
    except (TypeError, KeyError, IndexError, ValueError):
        return None
    whole = 8 + n + max(ends, default=0) == size
    return head + text if whole else None


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
    """Check every file a model directory's manifest lists (config, weights, tokenizer files,
    whatever its writer recorded). Without a manifest: one warning line per directory and
    process, or a `FolnetError` under `strict_checksums`."""
    directory = Path(directory)
    if read_manifest(directory) is not None:
        verify_files(directory)
        return
    if _promised_manifest(directory):
        raise FolnetError(f"{str(directory)!r} has lost its {MANIFEST}: its config.json says "
                          f"folnet wrote one ({MANIFEST_PROMISE!r}), so its files can no longer "
                          f"be checked and it is refused (a copy that left the file out, or a "
                          f"stray delete); restore {MANIFEST}, or record the files as they are "
                          f"now with folnet.checksums.write_model_manifest")
    if _strict():
        raise FolnetError(f"{str(directory)!r} has no {MANIFEST}, so its files cannot be "
                          f"checked, and checksums are strict (--strict-checksums or "
                          f"FOLNET_STRICT_CHECKSUMS); save it again with this folnet, or "
                          f"drop the option to load it unchecked")
    _warn_once(directory, f"{directory} has no {MANIFEST} (written before folnet recorded "
                          f"checksums, or copied without it): its weights and tokenizer are "
                          f"loaded UNCHECKED; --strict-checksums refuses such directories")


def _promised_manifest(directory: Path) -> bool:
    """Whether ``directory``'s config.json says folnet wrote a manifest with it (every model
    directory `folnet.arch.io.model_dir.save_pretrained` writes does; older ones do not)."""
    path = directory / "config.json"
    if not path.is_file():
        return False
    try:
        config = read_json(path, what="model config")
    except FolnetError:
        return False  # the loader reports a broken config itself
    return isinstance(config, dict) and config.get(MANIFEST_PROMISE) == MANIFEST


def _warn_once(where: Path, text: str) -> None:
    """`warn` ``text``, once per file or directory ``where`` and process."""
    key = str(where.resolve())
    if key not in _WARNED:
        _WARNED.add(key)
        warn(text)
