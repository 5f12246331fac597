"""A real-English corpus for tests and demos, built from what this machine already has.

Tests of tokenisation and masking statistics are only meaningful on natural text (Zipfian word
frequencies, real sentence lengths), yet the project cannot ship a book or fetch one. Every
Python install carries a few megabytes of hand-written English: the docstrings of the standard
library, plus the language-reference topics behind `help()` (`pydoc_data.topics`), all under
the PSF licence. `write_english_corpus` collects them, one docstring per document, in a fixed
order, so a given interpreter always produces the same file (about 1.4 MB on CPython 3.11).

Output format (the `.txt` format that `folnet.train.corpus` reads): documents are separated by
a blank line and each line holds one paragraph (wrapped docstring lines are joined), because a
line break is treated as a sentence boundary by the corpus reader.

The readers that turn local corpora into documents (lists of sentences) live here too:
`resolve_sources` checks paths eagerly (so a typo fails before any work starts),
`iter_documents` then reads lazily, one document at a time, so streaming stays bounded in
memory, and `source_signature` describes the inputs for the tokenised-data cache key.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import importlib.util
import inspect
import io
import json
import os
import pkgutil
import re
import sys
import warnings
from collections.abc import Iterator, Sequence
from functools import lru_cache
from pathlib import Path
from types import ModuleType

from folnet.errors import FolnetError, choices

__all__ = [
    "SUPPORTED_SUFFIXES",
    "iter_documents",
    "read_documents",
    "resolve_sources",
    "source_signature",
    "split_sentences",
    "stdlib_docstrings",
    "write_english_corpus",
]

SUPPORTED_SUFFIXES = (".txt", ".jsonl", ".json", ".parquet")
KINSHIP = "kinship"
CorpusSource = str | os.PathLike[str] | Sequence[str | os.PathLike[str]]

# Modules that do something on import (open a browser, print, start a GUI or a test run), that
# are shims rather than stdlib code (distutils is served by setuptools in a venv), or that hold
# little prose (codec tables, grammar files).
_SKIP_MODULES = frozenset(
    {
        "antigravity",
        "this",
        "idlelib",
        "turtledemo",
        "distutils",
        "lib2to3",
        "encodings",
        "ensurepip",
        "readline",
        "rlcompleter",
        "pydoc_data",
        "test",
        "tests",
        "site",
    }
)
_CODE_LINE = re.compile(r"^\s*(>>>|\.\.\. |\$ )")
_SPACES = re.compile(r"\s+")
_UNDERLINE = re.compile(r"^[*=~^-]{3,}\s*$", re.MULTILINE)  # reST section underlines


def _is_public(dotted: str) -> bool:
    """Skip private modules (`_foo`, `__main__`) and test modules at any level of the path."""
    parts = dotted.split(".")
    if any(part.startswith("_") for part in parts):
        return False
    if any(part in _SKIP_MODULES or part.startswith("test") for part in parts):
        return False
    return True


def _safe_import(name: str) -> ModuleType | None:
    """Import quietly: swallow warnings, stray prints and any failure (missing C extensions)."""
    sink = io.StringIO()
    with warnings.catch_warnings(), contextlib.redirect_stdout(sink):
        warnings.simplefilter("ignore")
        try:
            return importlib.import_module(name)
        except (Exception, SystemExit):  # ImportError, OSError, a module calling sys.exit()
            return None


def _stdlib_module_names() -> list[str]:
    """Public stdlib modules and their public submodules, sorted for a deterministic order."""
    names: set[str] = set()
    for top in sorted(getattr(sys, "stdlib_module_names", ())):
        if not _is_public(top):
            continue
        module = _safe_import(top)
        if module is None:
            continue
        names.add(top)
        path = getattr(module, "__path__", None)
        if path is None:
            continue
        # pkgutil.iter_modules lists without importing; recurse one package level at a time.
        stack = [(top, list(path))]
        while stack:
            prefix, paths = stack.pop()
            for info in pkgutil.iter_modules(paths):
                dotted = f"{prefix}.{info.name}"
                if not _is_public(dotted):
                    continue
                names.add(dotted)
                if info.ispkg:
                    sub = _safe_import(dotted)
                    if sub is not None and getattr(sub, "__path__", None) is not None:
                        stack.append((dotted, list(sub.__path__)))
    return sorted(names)


def _clean_docstring(doc: str) -> list[str]:
    """Docstring -> prose paragraphs (one string each); code, doctests and tables dropped."""
    paragraphs = []
    for block in re.split(r"\n\s*\n", doc):
        lines = [line for line in block.splitlines() if line.strip()]
        if not lines:
            continue
        if lines[0][:1].isspace():  # an indented block is a code sample or a table
            continue
        prose = [line for line in lines if not _CODE_LINE.match(line)]
        if len(prose) < len(lines) / 2:  # mostly a doctest session: not running text
            continue
        text = _SPACES.sub(" ", " ".join(prose)).strip()
        letters = sum(ch.isalpha() or ch == " " for ch in text)
        if len(text.split()) >= 4 and letters >= 0.75 * len(text):
            paragraphs.append(text)
    return paragraphs


def _module_docs(module: ModuleType) -> Iterator[str]:
    """The module's own docstring, then those of its public classes/functions and methods."""
    own = module.__name__
    if module.__doc__:
        yield module.__doc__
    for name, obj in sorted(vars(module).items()):
        home = getattr(obj, "__module__", None)
        # Keep objects defined here or in a private helper re-exported here (`io` <- `_io`).
        if name.startswith("_") or not isinstance(home, str):
            continue
        if home != own and not home.lstrip(".").startswith("_"):
            continue
        if not (inspect.isclass(obj) or inspect.isroutine(obj)):
            continue
        doc = inspect.getdoc(obj)
        if doc:
            yield doc
        if inspect.isclass(obj):
            for member_name, member in sorted(vars(obj).items()):
                if member_name.startswith("_"):
                    continue
                if inspect.isroutine(member) or isinstance(member, property):
                    member_doc = inspect.getdoc(member)
                    if member_doc:
                        yield member_doc


@lru_cache(maxsize=1)
def stdlib_docstrings() -> tuple[tuple[str, ...], ...]:
    """All usable stdlib docstrings as documents (tuples of paragraphs), deduplicated.

    Cached per process: importing the whole standard library takes a few seconds and the
    result cannot change while the interpreter runs.
    """
    seen: set[str] = set()
    documents: list[tuple[str, ...]] = []
    for name in _stdlib_module_names():
        module = sys.modules.get(name) or _safe_import(name)
        if module is None:
            continue
        try:
            with warnings.catch_warnings():  # e.g. touching typing.io warns on 3.11
                warnings.simplefilter("ignore")
                docs = list(_module_docs(module))
        except Exception:  # an exotic object whose attribute access raises
            continue
        for doc in docs:
            if doc in seen:  # inherited docstrings repeat across subclasses
                continue
            seen.add(doc)
            paragraphs = _clean_docstring(doc)
            if paragraphs:
                documents.append(tuple(paragraphs))
    documents.extend(_help_topics())
    return tuple(documents)


def _help_topics() -> list[tuple[str, ...]]:
    """The language-reference sections that `help()` shows (`pydoc_data.topics`), as documents.

    Docstrings alone come to about 1 MB; these topics are the same kind of PSF-licensed prose
    that ships with the interpreter and add several hundred kilobytes more.
    """
    module = _safe_import("pydoc_data.topics")
    topics = getattr(module, "topics", None)
    if not isinstance(topics, dict):
        return []
    documents = []
    for key in sorted(topics):
        text = _UNDERLINE.sub("", str(topics[key]))
        paragraphs = _clean_docstring(text)
        if paragraphs:
            documents.append(tuple(paragraphs))
    return documents


def write_english_corpus(path: str | os.PathLike[str], max_bytes: int = 3_000_000) -> Path:
    """Write up to `max_bytes` (UTF-8) of stdlib docstring prose to `path`; return the path.

    Documents are written whole, in a deterministic order, until the next one would exceed
    `max_bytes`. Raises FolnetError if `max_bytes` is not positive.
    """
    if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes <= 0:
        raise FolnetError(f"max_bytes must be a positive integer, got {max_bytes!r}")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    written = 0
    chunks: list[str] = []
    for paragraphs in stdlib_docstrings():
        chunk = "\n".join(paragraphs) + "\n\n"
        size = len(chunk.encode("utf-8"))
        if written + size > max_bytes:
            break
        chunks.append(chunk)
        written += size
    path.write_text("".join(chunks), encoding="utf-8")
    return path


# -- sentence splitting ----------------------------------------------------------------------

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
    """Hash of the kinship generator's code (kinship*.py), so editing it invalidates caches."""
    spec = importlib.util.find_spec("folnet.train.kinship")
    origin = getattr(spec, "origin", None)
    if not origin or not Path(origin).is_file():
        return "missing"
    digest = hashlib.sha256()
    for file in sorted(Path(origin).parent.glob("kinship*.py")):
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
    try:
        from folnet.train.kinship import pretraining_documents
    except ImportError as exc:
        raise FolnetError(f"the {KINSHIP!r} corpus needs folnet.train.kinship: {exc}") from None
    for document in pretraining_documents(num_documents, seed=seed):
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
