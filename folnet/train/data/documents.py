"""Corpus documents: every part of a corpus (see `folnet.train.data.sources`) read as documents,
lists of sentences, with an English sentence splitter; and the fingerprint the cache keys on.

A record (a paragraph of a text file, a JSON object, a row) is one document; its sentences are
found by `split_sentences`, which treats every line break as a boundary too.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterator
from pathlib import Path

from folnet.train.data import kinship
from folnet.train.data.sources import (
    KINSHIP,
    CorpusSource,
    Part,
    read_texts,
    resolve_sources,
)

__all__ = [
    "KINSHIP",
    "CorpusSource",
    "iter_documents",
    "read_documents",
    "resolve_sources",
    "source_signature",
    "split_sentences",
]


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


# -- documents ---------------------------------------------------------------------------------


def source_signature(parts: list[Part], *, kinship_documents: int, seed: int,
                     text_column: str = "text") -> list[list[object]]:
    """What identifies the input for caching: absolute path, size and mtime of every file and
    the text column; for the kinship corpus its size, seed and a hash of the generator's code."""
    signature: list[list[object]] = []
    for kind, path in parts:
        if path is None:
            signature.append([kind, kinship_documents, seed, _kinship_code_hash()])
            continue
        files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
        for file in files:
            stat = file.stat()
            column = "text" if kind == "text" else text_column
            signature.append([kind, column, str(file.resolve()), stat.st_size, stat.st_mtime_ns])
    return signature


def _kinship_code_hash() -> str:
    """Hash of the kinship generator's code (the modules of its package), so editing it
    invalidates caches."""
    digest = hashlib.sha256()
    for file in sorted(Path(kinship.__file__).parent.glob("*.py")):
        digest.update(file.name.encode() + b"\0" + file.read_bytes())
    return digest.hexdigest()[:16]


def _read_kinship(num_documents: int, seed: int) -> Iterator[list[str]]:
    for document in kinship.pretraining_documents(num_documents, seed=seed):
        sentences = [" ".join(str(s).split()) for s in document]
        sentences = [s for s in sentences if s]
        if sentences:
            yield sentences


def iter_documents(source: CorpusSource, *, kinship_documents: int = 2000, seed: int = 0,
                   text_column: str = "text") -> Iterator[list[str]]:
    """Yield each document of `source` as a list of sentences, lazily and in a fixed order.

    Paths are checked before this returns (a typo fails here, not mid-iteration).
    """
    parts = resolve_sources(source)
    return read_documents(parts, kinship_documents=kinship_documents, seed=seed,
                          text_column=text_column)


def read_documents(parts: list[Part], *, kinship_documents: int = 2000, seed: int = 0,
                   text_column: str = "text") -> Iterator[list[str]]:
    """`iter_documents` for parts already checked by `resolve_sources`; records whose text
    holds no sentence are skipped."""
    for kind, path in parts:
        if kind == KINSHIP:
            yield from _read_kinship(kinship_documents, seed)
            continue
        assert path is not None  # only the kinship part has no path (resolve_sources)
        for text in read_texts(kind, path, text_column):
            sentences = split_sentences(text)
            if sentences:
                yield sentences
