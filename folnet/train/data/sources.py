"""Where a corpus comes from: `--data` resolved to files, and each file read (through `datasets`
but for plain text).

A corpus is given as a file, a folder (its supported files, recursively, in sorted order), a glob
pattern, a folder written by `datasets`' ``save_to_disk``, the word ``kinship`` (the embedded
kinship world), or a list of these. `resolve_sources` checks all of it up front, so a typo fails
before any work starts, and names each part with the `datasets` builder that reads it:

=========================  ===========  ======================================================
file                       builder      one record is
=========================  ===========  ======================================================
.txt                       ``text``     a paragraph (documents are separated by an empty line)
.json .jsonl               ``json``     an object (JSON Lines, or one array of objects)
.csv                       ``csv``      a row
.parquet                   ``parquet``  a row
.arrow                     ``arrow``    a row (an Arrow IPC stream file)
=========================  ===========  ======================================================

Text formats may be compressed (``.gz``, ``.bz2``, ``.xz``, ``.zst``); `datasets` (through
fsspec) decompresses them while streaming. An uncompressed ``.txt`` file is split here
(`paragraphs`), exactly as `datasets`' text builder splits it and streaming the same way,
without importing `datasets`: that import and its builder's set-up are a start-up cost of every
pretraining process (each seed process of ``folnet ablate --jobs``;
docs/results/measurements.md). Every other file is read with ``streaming=True``: records
arrive lazily in file order and nothing is copied into the `datasets` cache, so a corpus larger
than memory or disk works, and the order is fixed, which exact resume relies on.

The text of a record is the ``text_column`` field (``--text-column``, default ``text``); plain
text files have one column, ``text``, whatever the option says.

Text, JSON and CSV files are decoded with ``encoding`` (``--encoding``, default utf-8; parquet,
arrow and saved datasets hold decoded strings). Every file is checked to be text as it is read
(`folnet.train.data.checks`: its first MiB up front, then every record): bytes that do not
decode, or more than 1% control characters, are an error naming the file and the share. A JSON
file is also read once more before `datasets` reads it, for lines nested too deeply for its
parser (`folnet.train.data.checks.check_json_depth`: such a line crashed the process).

A path given by name must be a regular file (or a folder): a FIFO or a device (a link to
/dev/zero, say) is refused by `os.stat` alone, before anything opens it -- opening a FIFO
blocks until another process writes to it, and a device never ends.
"""

from __future__ import annotations

import glob
import importlib.util
import os
import stat
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from folnet.errors import FolnetError, choices
from folnet.train.data.checks import TextMeter, check_json_depth, check_sample, is_utf8

__all__ = [
    "COMPRESSIONS",
    "EMBEDDED",
    "FORMATS",
    "KINSHIP",
    "KINSHIP_SYMBOLIC",
    "SAVED",
    "CorpusSource",
    "Part",
    "check_texts",
    "is_saved_dataset",
    "paragraphs",
    "read_texts",
    "resolve_sources",
]

KINSHIP = "kinship"
KINSHIP_SYMBOLIC = "kinship-symbolic"
#: the embedded corpora: named by a word instead of a path (`folnet.train.data.kinship`)
EMBEDDED = (KINSHIP, KINSHIP_SYMBOLIC)
SAVED = "saved"  # a `save_to_disk` folder
#: file suffix -> the `datasets` builder that reads it
FORMATS = {".txt": "text", ".json": "json", ".jsonl": "json", ".csv": "csv",
           ".parquet": "parquet", ".arrow": "arrow"}
#: compression suffix -> the module fsspec needs for it (None: the standard library has it)
COMPRESSIONS = {".gz": None, ".bz2": None, ".xz": None, ".zst": "zstandard"}
_COMPRESSIBLE = frozenset({"text", "json", "csv"})
_GLOB_CHARS = frozenset("*?[")

CorpusSource = str | os.PathLike[str] | Sequence[str | os.PathLike[str]]
#: one part of a corpus: (builder name, ``saved`` or an `EMBEDDED` name; its path, None for
#: an embedded corpus)
Part = tuple[str, Path | None]


def _suffixes(path: Path) -> tuple[str, str | None]:
    """(format suffix, compression suffix or None) of a file name, lower-cased."""
    suffix = path.suffix.lower()
    if suffix in COMPRESSIONS:
        return Path(path.stem).suffix.lower(), suffix
    return suffix, None


def _supported(path: Path) -> bool:
    suffix, compression = _suffixes(path)
    return suffix in FORMATS and (compression is None or FORMATS[suffix] in _COMPRESSIBLE)


def _accepted() -> str:
    return (f"{choices(tuple(FORMATS))} (text formats also as "
            f"{'/'.join(COMPRESSIONS)}), a `save_to_disk` folder, or "
            f"{' or '.join(map(repr, EMBEDDED))}")


def _format_of(path: Path) -> str:
    """The builder of one file, after checking it can be read at all."""
    suffix, compression = _suffixes(path)
    if not _supported(path):
        kind = "".join(path.suffixes[-2:]).lower() or "(no suffix)"
        raise FolnetError(f"corpus file {str(path)!r} has unsupported type {kind!r}; "
                          f"expected {_accepted()}")
    module = COMPRESSIONS.get(compression or "")
    if module is not None and importlib.util.find_spec(module) is None:
        raise FolnetError(f"corpus file {str(path)!r} is {compression}-compressed, which needs "
                          f"the {module!r} package: pip install 'folnet[train]'")
    if path.stat().st_size == 0:
        raise FolnetError(f"corpus file {str(path)!r} is empty")
    return FORMATS[suffix]


def is_saved_dataset(path: Path) -> bool:
    """A `Dataset` folder written by ``save_to_disk`` (alone, or as a `DatasetDict`'s split)."""
    return (path / "state.json").is_file() and (path / "dataset_info.json").is_file()


def _is_saved(path: Path) -> bool:
    """A folder written by ``save_to_disk``: a `Dataset` or a `DatasetDict`."""
    return (path / "dataset_dict.json").is_file() or is_saved_dataset(path)


def _folder_files(path: Path) -> list[Path]:
    """Supported files under a folder, recursively and sorted; hidden entries are skipped."""
    return sorted(p for p in path.rglob("*")
                  if p.is_file() and _supported(p)
                  and not any(part.startswith(".") for part in p.relative_to(path).parts))


#: What `os.stat` says a path is, for an error about one that is neither file nor folder.
_FILE_KINDS = ((stat.S_ISFIFO, "a named pipe (FIFO)"), (stat.S_ISCHR, "a character device"),
               (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def _check_regular(path: Path) -> None:
    """Refuse a path (after links) that is neither a regular file nor a folder, by its
    `os.stat` alone: opening a FIFO blocks, reading a device never ends, and either was
    reported as "an empty corpus directory"."""
    try:
        mode = os.stat(path).st_mode
    except OSError as exc:
        raise FolnetError(f"cannot read corpus path {str(path)!r}: "
                          f"{exc.strerror or exc}") from None
    if stat.S_ISREG(mode) or stat.S_ISDIR(mode):
        return
    kind = next((name for test, name in _FILE_KINDS if test(mode)),
                f"a file of another kind ({stat.filemode(mode)})")
    linked = f" (a link to {os.path.realpath(path)!r})" if path.is_symlink() else ""
    raise FolnetError(f"corpus path {str(path)!r}{linked} is not a regular file: it is {kind}; "
                      f"give a file, a folder or a glob pattern of files")


def _resolve_one(item: str | os.PathLike[str]) -> list[Part]:
    if isinstance(item, str) and item in EMBEDDED:
        return [(item, None)]
    text = os.fspath(item)
    path = Path(text).expanduser()
    if not path.exists() and _GLOB_CHARS & set(text):
        matches = sorted(Path(m) for m in glob.glob(os.path.expanduser(text), recursive=True))
        files = [m for m in matches if m.is_file() and _supported(m)]
        if not files:
            raise FolnetError(f"corpus pattern {text!r} matches no file of a supported type "
                              f"({len(matches)} match(es) in all); expected {_accepted()}")
        return [(_format_of(f), f) for f in files]
    if not path.exists():
        raise FolnetError(f"corpus path {str(path)!r} does not exist")
    _check_regular(path)
    if path.is_file():
        return [(_format_of(path), path)]
    if _is_saved(path):
        return [(SAVED, path)]
    files = _folder_files(path)
    if not files:
        raise FolnetError(f"corpus directory {str(path)!r} is empty: it holds no file of a "
                          f"supported type and is not a `save_to_disk` folder; expected "
                          f"{_accepted()}")
    return [(_format_of(f), f) for f in files]


def resolve_sources(source: CorpusSource) -> list[Part]:
    """Check `source` now and list its parts in reading order (see the module docstring)."""
    if isinstance(source, (str, os.PathLike)):
        items: list[str | os.PathLike[str]] = [source]
    else:
        items = list(source)
        if not items:
            raise FolnetError("corpus source is an empty list")
    return [part for item in items for part in _resolve_one(item)]


# -- reading -------------------------------------------------------------------------------------


def import_datasets(reading: str = "reading a corpus file") -> Any:
    """`datasets`, offline (data here is always local and nothing may be fetched); without the
    package, a `FolnetError` saying what needed it (``reading``) and the extra to install."""
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    try:
        import datasets
    except ImportError:
        raise FolnetError(f"{reading} needs the `datasets` package: "
                          "pip install 'folnet[train]'") from None
    return datasets


def _saved_split(path: Path) -> Any:
    """The dataset of a ``save_to_disk`` folder; a DatasetDict contributes its train split."""
    datasets = import_datasets()
    loaded = datasets.load_from_disk(str(path))
    if isinstance(loaded, datasets.DatasetDict):
        if "train" in loaded:
            return loaded["train"]
        if len(loaded) == 1:
            return next(iter(loaded.values()))
        raise FolnetError(f"saved dataset {str(path)!r} has splits {sorted(loaded)} but no "
                          f"'train' split")
    return loaded


def _missing(path: Path, column: str, columns: Sequence[str]) -> FolnetError:
    return FolnetError(f"{str(path)!r} has no column {column!r} (columns: {sorted(columns)}); "
                       f"pick one with --text-column")


def check_texts(parts: Sequence[Part], encoding: str = "utf-8") -> None:
    """Check that every file of `parts` can be decoded with `encoding` and looks like text
    (its first MiB, `folnet.train.data.checks.check_sample`); cheap enough to run before a
    run writes anything."""
    for kind, path in parts:
        if path is not None and kind != SAVED:
            _check_encoding_applies(kind, path, encoding)
            check_sample(kind, path, encoding)


def _check_encoding_applies(kind: str, path: Path, encoding: str) -> None:
    """`datasets` reads a compressed text file as UTF-8 whatever encoding it is given (its JSON
    and CSV readers do apply it): refuse rather than decode it wrongly."""
    if kind == "text" and _suffixes(path)[1] is not None and not is_utf8(encoding):
        raise FolnetError(f"corpus file {str(path)!r}: --encoding {encoding} cannot be applied "
                          f"to a compressed text file (it is read as utf-8); decompress it, or "
                          f"convert it to utf-8")


#: characters `paragraphs` reads at a time (as `datasets`' text builder: 10 MiB)
PARAGRAPH_CHUNK = 10 << 20


def paragraphs(path: Path, encoding: str = "utf-8", chunk: int = PARAGRAPH_CHUNK
               ) -> Iterator[str]:
    """The paragraphs of a plain text file, lazily: its text (universal newlines) split at
    every ``"\\n\\n"``, empty pieces left out -- the records `datasets`' ``text`` builder makes
    with ``sample_by="paragraph"`` (tests/data/test_sources.py compares the two), read
    ``chunk`` characters at a time, so a file larger than memory streams."""
    with open(path, encoding=encoding) as f:
        carry = ""  # the last piece read, which the next chunk may continue
        while block := f.read(chunk):
            pieces = (carry + block).split("\n\n")
            carry = pieces.pop()
            yield from (piece for piece in pieces if piece)
        if carry:
            yield carry


def _values(kind: str, path: Path, column: str, encoding: str) -> Iterator[Any]:
    """The `column` field of every record of one part, lazily, in file order."""
    if kind == "text" and _suffixes(path)[1] is None:
        yield from paragraphs(path, encoding)
        return
    if kind == SAVED:
        dataset = _saved_split(path)
        if column not in dataset.column_names:
            raise _missing(path, column, dataset.column_names)
        for batch in dataset.select_columns([column]).iter(batch_size=1024):
            yield from batch[column]
        return
    options: dict[str, Any] = {"sample_by": "paragraph"} if kind == "text" else {}
    if kind in ("text", "json", "csv"):
        options["encoding"] = encoding
    stream = import_datasets().load_dataset(kind, data_files=[str(path)], split="train",
                                      streaming=True, **options)
    for record in stream:
        if column not in record:
            raise _missing(path, column, list(record))
        yield record[column]


def read_texts(kind: str, path: Path, text_column: str = "text",
               encoding: str = "utf-8") -> Iterator[str]:
    """The text of every record of one part (records without text, e.g. an empty CSV cell,
    are skipped), decoded with `encoding` where the format needs one. A missing column, an
    unreadable file or one that is not text (see the module docstring) is a `FolnetError`
    naming it."""
    if kind != SAVED:
        _check_encoding_applies(kind, path, encoding)
        check_sample(kind, path, encoding)
    if kind == "json":
        check_json_depth(path, encoding)
    values = _values(kind, path, "text" if kind == "text" else text_column, encoding)
    meter = TextMeter(path, encoding)
    number = 0
    while True:
        try:
            value = next(values)
        except StopIteration:
            meter.finish()
            return
        except FolnetError:
            raise
        except Exception as exc:  # pyarrow, json, pandas and fsspec errors alike: name the file
            message = " ".join(str(exc).split())
            hint = (f"; pass --encoding with the file's encoding (now {encoding})"
                    if isinstance(exc, UnicodeDecodeError) else "")
            raise FolnetError(f"cannot read {str(path)!r} as {kind}: {message}{hint}") from None
        number += 1
        if value is None:
            continue
        if not isinstance(value, str):
            raise FolnetError(f"{str(path)!r} record {number}: column {text_column!r} holds "
                              f"{type(value).__name__} {value!r}, expected text")
        meter.add(value)
        yield value
