"""Corpus documents: reading local text, JSON Lines, parquet, saved datasets or the embedded
kinship world as documents (lists of sentences), with an English sentence splitter.

`resolve_sources` checks paths up front (missing, empty, unknown type are errors naming the
path); `iter_documents` streams documents lazily so corpora larger than memory work;
`source_signature` fingerprints the inputs for the tokenised-data cache.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Iterator, Sequence
from pathlib import Path

from folnet.errors import FolnetError, choices
from folnet.train.data import kinship

__all__ = [
    "KINSHIP",
    "SUPPORTED_SUFFIXES",
    "CorpusSource",
    "iter_documents",
    "read_documents",
    "resolve_sources",
    "source_signature",
    "split_sentences",
]

SUPPORTED_SUFFIXES = (".txt", ".jsonl", ".json", ".parquet")
KINSHIP = "kinship"
CorpusSource = str | os.PathLike[str] | Sequence[str | os.PathLike[str]]


# A sentence ends at . ! or ? (plus closing quotes/brackets) when whitespace and an upper-case
# letter, digit or opening quote follow. Lower-case continuations ("e.g. the") never split.
_BOUNDARY = re.compile(r"""[.!?]+["'\u201d\u2019)\]]*(?=\s+["'\u201c\u2018(\[]?[A-Z0-9])""")
_ABBREVIATIONS = frozenset(
    "mr mrs ms dr prof sr jr st vs cf fig figs no nos vol eq eqs approx dept est inc ltd co"
    " gen gov sen rep mt ft jan feb mar apr jun jul aug sep sept oct nov dec".split()
)
_DOTTED = re.compile(r"^(?:[a-z]\.)+[a-z]$")  # e.g, i.e, u.s


def _ends_with_abbreviation(text: str) -> bool:
    """Whether the word before a final "." is an abbreviation or an initial ("J.")."""
    words = text.split()
    if not words:
        return False
    word = words[-1].lstrip("(\"'\u201c").lower()
    return (
        word in _ABBREVIATIONS or bool(_DOTTED.match(word)) or (len(word) == 1 and word.isalpha())
    )


def split_sentences(text: str) -> list[str]:
    """Split text into sentences; every line break is a boundary too.

    A small regex splitter, not a parser: it is tuned for English prose and for the
    "one or more sentences per line" corpus format, and keeps common abbreviations,
    initials and decimal numbers ("Dr. Smith", "J. Doe", "3.5") inside their sentence.
    """
    sentences: list[str] = []
    for raw in text.splitlines():
        line = " ".join(raw.split())
        start = 0
        for match in _BOUNDARY.finditer(line):
            if line[match.start()] == "." and _ends_with_abbreviation(line[start : match.start()]):
                continue
            sentences.append(line[start : match.end()].strip())
            start = match.end()
        tail = line[start:].strip()
        if tail:
            sentences.append(tail)
    return [s for s in sentences if s]


# -- local corpora -----------------------------------------------------------------------------


def _is_saved_dataset(path: Path) -> bool:
    """A directory written by `datasets` `save_to_disk` (a Dataset or a DatasetDict)."""
    return (path / "dataset_dict.json").is_file() or (
        (path / "state.json").is_file() and (path / "dataset_info.json").is_file()
    )


def _kind_of(path: Path) -> str:
    suffix = path.suffix.lower()
    if suffix not in SUPPORTED_SUFFIXES:
        raise FolnetError(
            f"corpus file {str(path)!r} has unsupported type {suffix or '(no suffix)'!r}; "
            f"expected {choices(SUPPORTED_SUFFIXES)}, a saved `datasets` directory, or "
            f"{KINSHIP!r}"
        )
    if path.stat().st_size == 0:
        raise FolnetError(f"corpus file {str(path)!r} is empty")
    return suffix.lstrip(".")


def resolve_sources(source: CorpusSource) -> list[tuple[str, Path | None]]:
    """Check `source` now and list its parts as `(kind, path)`; kind is txt/jsonl/json/
    parquet/saved/kinship. A directory contributes its supported files in sorted order."""
    if isinstance(source, (str, os.PathLike)):
        items: list[str | os.PathLike[str]] = [source]
    else:
        items = list(source)
        if not items:
            raise FolnetError("corpus source is an empty list")
    resolved: list[tuple[str, Path | None]] = []
    for item in items:
        if isinstance(item, str) and item == KINSHIP:
            resolved.append((KINSHIP, None))
            continue
        path = Path(item).expanduser()
        if not path.exists():
            raise FolnetError(f"corpus path {str(path)!r} does not exist")
        if path.is_file():
            resolved.append((_kind_of(path), path))
        elif _is_saved_dataset(path):
            resolved.append(("saved", path))
        else:
            files = sorted(
                p
                for p in path.rglob("*")
                if p.is_file()
                and p.suffix.lower() in SUPPORTED_SUFFIXES
                and not any(part.startswith(".") for part in p.relative_to(path).parts)
            )
            if not files:
                raise FolnetError(
                    f"corpus directory {str(path)!r} is empty: it holds no "
                    f"{choices(SUPPORTED_SUFFIXES)} file and is not a saved `datasets` dataset"
                )
            resolved.extend((_kind_of(p), p) for p in files)
    return resolved


def source_signature(
    parts: list[tuple[str, Path | None]], *, kinship_documents: int, seed: int
) -> list[list[object]]:
    """What identifies the input for caching: absolute path, size and mtime of every file;
    for the kinship corpus its size, seed and a hash of the generator's source code."""
    signature: list[list[object]] = []
    for kind, path in parts:
        if path is None:
            signature.append([kind, kinship_documents, seed, _kinship_code_hash()])
            continue
        files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
        for file in files:
            stat = file.stat()
            signature.append([kind, str(file.resolve()), stat.st_size, stat.st_mtime_ns])
    return signature


def _kinship_code_hash() -> str:
    """Hash of the kinship generator's code (the modules of its package), so editing it
    invalidates caches."""
    digest = hashlib.sha256()
    for file in sorted(Path(kinship.__file__).parent.glob("*.py")):
        digest.update(file.name.encode() + b"\0" + file.read_bytes())
    return digest.hexdigest()[:16]


def _text_documents(text: str) -> Iterator[list[str]]:
    sentences = split_sentences(text)
    if sentences:
        yield sentences


def _read_txt(path: Path) -> Iterator[list[str]]:
    """Blank lines separate documents; each line holds one or more sentences."""
    document: list[str] = []
    with path.open(encoding="utf-8", errors="replace") as handle:
        for line in handle:
            if line.strip():
                document.extend(split_sentences(line))
            elif document:
                yield document
                document = []
    if document:
        yield document


def _text_field(record: object, where: str) -> str:
    if not isinstance(record, dict) or not isinstance(record.get("text"), str):
        raise FolnetError(f"{where}: expected a JSON object with a string 'text' field")
    return record["text"]


def _read_json(path: Path) -> Iterator[list[str]]:
    """JSON Lines (one object per line), or for .json also a single array of objects."""
    with path.open(encoding="utf-8", errors="replace") as handle:
        head = handle.read(4096).lstrip()
        handle.seek(0)
        if path.suffix.lower() == ".json" and head.startswith("["):
            try:
                records = json.load(handle)
            except json.JSONDecodeError as exc:
                raise FolnetError(f"{path}: invalid JSON: {exc}") from None
            for index, record in enumerate(records):
                yield from _text_documents(_text_field(record, f"{path}[{index}]"))
            return
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise FolnetError(f"{path}:{number}: invalid JSON: {exc}") from None
            yield from _text_documents(_text_field(record, f"{path}:{number}"))


def _read_parquet(path: Path) -> Iterator[list[str]]:
    import pyarrow.parquet as pq

    try:
        handle = pq.ParquetFile(str(path))
    except Exception as exc:  # pyarrow raises ArrowInvalid and friends
        raise FolnetError(f"cannot read parquet file {str(path)!r}: {exc}") from None
    if "text" not in handle.schema_arrow.names:
        raise FolnetError(
            f"parquet file {str(path)!r} has no 'text' column (columns: "
            f"{handle.schema_arrow.names})"
        )
    for batch in handle.iter_batches(batch_size=1024, columns=["text"]):
        for text in batch.column(0).to_pylist():
            if isinstance(text, str):
                yield from _text_documents(text)


def _read_saved(path: Path) -> Iterator[list[str]]:
    """A `save_to_disk` directory, memory-mapped; a DatasetDict contributes its train split."""
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    import datasets

    loaded = datasets.load_from_disk(str(path))
    if isinstance(loaded, datasets.DatasetDict):
        if "train" in loaded:
            loaded = loaded["train"]
        elif len(loaded) == 1:
            loaded = next(iter(loaded.values()))
        else:
            raise FolnetError(
                f"saved dataset {str(path)!r} has splits {sorted(loaded)} but no 'train' split"
            )
    if "text" not in loaded.column_names:
        raise FolnetError(
            f"saved dataset {str(path)!r} has no 'text' column (columns: {loaded.column_names})"
        )
    for batch in loaded.select_columns(["text"]).iter(batch_size=1024):
        for text in batch["text"]:
            if isinstance(text, str):
                yield from _text_documents(text)


def _read_kinship(num_documents: int, seed: int) -> Iterator[list[str]]:
    for document in kinship.pretraining_documents(num_documents, seed=seed):
        sentences = [" ".join(str(s).split()) for s in document]
        sentences = [s for s in sentences if s]
        if sentences:
            yield sentences


_READERS = {"txt": _read_txt, "jsonl": _read_json, "json": _read_json}
_READERS.update(parquet=_read_parquet, saved=_read_saved)


def iter_documents(
    source: CorpusSource, *, kinship_documents: int = 2000, seed: int = 0
) -> Iterator[list[str]]:
    """Yield each document of `source` as a list of sentences, lazily and in a fixed order.

    Paths are checked before this returns (a typo fails here, not mid-iteration).
    """
    parts = resolve_sources(source)
    return read_documents(parts, kinship_documents=kinship_documents, seed=seed)


def read_documents(
    parts: list[tuple[str, Path | None]], *, kinship_documents: int = 2000, seed: int = 0
) -> Iterator[list[str]]:
    """`iter_documents` for parts already checked by `resolve_sources`."""
    for kind, path in parts:
        if kind == KINSHIP:
            yield from _read_kinship(kinship_documents, seed)
        else:
            yield from _READERS[kind](path)
