"""Corpus documents: every part of a corpus (see `folnet.train.data.sources`) read as documents,
lists of sentences, with an English sentence splitter; and the fingerprint the cache keys on.

A record (a paragraph of a text file, a JSON object, a row) is one document; its sentences are
found by `split_sentences`, which treats every line break as a boundary too.

No sentence is longer than `MAX_SENTENCE_CHARS` characters: a longer one is cut at spaces into
pieces of at most that length (consecutive "sentences" of the document), and a run of more
than that many characters with no whitespace at all is cut every `MAX_SENTENCE_CHARS`
characters, with a warning naming the file (WordPiece reads any word over 100 characters as
[UNK], so such a run is not text the model can learn from). Why: a long line with no sentence
end would go to the tokenizer whole, which aborts the process after gigabytes of memory
(docs/results/measurements.md); and a sequence holds at most a few hundred tokens, so nothing
longer is ever used whole.
"""

from __future__ import annotations

import hashlib
import re
import warnings
from collections.abc import Iterator
from pathlib import Path

from folnet.errors import FolnetError
from folnet.train.data import kinship
from folnet.train.data.checks import canonical_encoding
from folnet.train.data.sources import (
    EMBEDDED,
    KINSHIP,
    KINSHIP_SYMBOLIC,
    CorpusSource,
    Part,
    read_texts,
    resolve_sources,
)

__all__ = [
    "EMBEDDED",
    "KINSHIP",
    "MAX_SENTENCE_CHARS",
    "CorpusSource",
    "iter_documents",
    "kinship_documents",
    "kinship_examples",
    "read_documents",
    "resolve_sources",
    "source_signature",
    "split_sentences",
]

#: The longest sentence, in characters, that reaches the tokenizer (see the module docstring):
#: about 400-500 WordPiece tokens of English, more than a 128- or 512-token sequence uses.
MAX_SENTENCE_CHARS = 2000

# A sentence ends at . ! or ? (plus closing quotes/brackets) when whitespace and an upper-case
# letter, digit or opening quote follow. Lower-case continuations ("e.g. the") never split. The
# look-behind starts a match only at the first mark of a run ("...."), which keeps the search
# linear in the length of the line.
_BOUNDARY = re.compile(
    r"""(?<![.!?])[.!?]+["'\u201d\u2019)\]]*(?=\s+["'\u201c\u2018(\[]?[A-Z0-9])""")
_ABBREVIATIONS = frozenset(
    "mr mrs ms dr prof sr jr st vs cf fig figs no nos vol eq eqs approx dept est inc ltd co"
    " gen gov sen rep mt ft jan feb mar apr jun jul aug sep sept oct nov dec".split()
)
_DOTTED = re.compile(r"^(?:[a-z]\.)+[a-z]$")  # e.g, i.e, u.s
_WORD_WINDOW = 24  # longer than any abbreviation or initial the splitter keeps together


def _ends_with_abbreviation(line: str, start: int, end: int) -> bool:
    """Whether the word before the "." at ``line[end]`` (in the sentence that began at
    `start`) is an abbreviation or an initial ("J."). Only the last `_WORD_WINDOW` characters
    are looked at, so a line of many abbreviations is still split in linear time."""
    low = max(start, end - _WORD_WINDOW)
    window = line[low:end]
    words = window.split()
    if not words or (low > start and len(words) == 1 and not window[0].isspace()):
        return False  # nothing before it, or a word longer than the window
    word = words[-1].lstrip("(\"'\u201c").lower()
    return (
        word in _ABBREVIATIONS or bool(_DOTTED.match(word)) or (len(word) == 1 and word.isalpha())
    )


def _pieces(sentence: str, limit: int, out: list[str]) -> int:
    """Append `sentence` to `out` cut at spaces into pieces of at most `limit` characters;
    return how many cuts found no space (a run of more than `limit` non-space characters).
    Whitespace is already single spaces (`split_sentences`)."""
    hard, start = 0, 0
    while len(sentence) - start > limit:
        cut = sentence.rfind(" ", start, start + limit + 1)
        if cut <= start:  # no space to cut at
            cut, hard = start + limit, hard + 1
            out.append(sentence[start:cut])
            start = cut + (sentence[cut : cut + 1] == " ")
        else:
            out.append(sentence[start:cut])
            start = cut + 1
    if start < len(sentence):
        out.append(sentence[start:])
    return hard


def _split(text: str, limit: int) -> tuple[list[str], int]:
    """`split_sentences`, and how many runs without whitespace had to be cut."""
    sentences: list[str] = []
    hard = 0
    for raw in text.splitlines():
        line = " ".join(raw.split())
        start = 0
        found = []
        for match in _BOUNDARY.finditer(line):
            if line[match.start()] == "." and _ends_with_abbreviation(line, start,
                                                                       match.start()):
                continue
            found.append(line[start : match.end()].strip())
            start = match.end()
        found.append(line[start:].strip())
        for sentence in found:
            if len(sentence) > limit:
                hard += _pieces(sentence, limit, sentences)
            elif sentence:
                sentences.append(sentence)
    return sentences, hard


def split_sentences(text: str, max_chars: int = MAX_SENTENCE_CHARS) -> list[str]:
    """Split text into sentences of at most `max_chars` characters; every line break is a
    boundary too.

    A small regex splitter, not a parser: it is tuned for English prose and for the
    "one or more sentences per line" corpus format, and keeps common abbreviations,
    initials and decimal numbers ("Dr. Smith", "J. Doe", "3.5") inside their sentence.
    Longer sentences are cut at spaces (see the module docstring). Linear in the length of
    the text, whatever the text.
    """
    if isinstance(max_chars, bool) or not isinstance(max_chars, int) or max_chars < 1:
        raise FolnetError(f"max_chars must be a positive integer, got {max_chars!r}")
    return _split(text, max_chars)[0]


# -- documents ---------------------------------------------------------------------------------


def source_signature(parts: list[Part], *, kinship_documents: int, seed: int,
                     text_column: str = "text", encoding: str = "utf-8") -> list[list[object]]:
    """What identifies the input for caching: absolute path, size and mtime of every file and
    the text column (and the encoding, unless utf-8, so older utf-8 entries stay valid); for
    the kinship corpus its size, seed and a hash of the generator's code."""
    codec = canonical_encoding(encoding)
    signature: list[list[object]] = [] if codec == "utf-8" else [["encoding", codec]]
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


def kinship_examples(num_documents: int, seed: int,
                     held_out: kinship.HeldOut | None = None) -> list[kinship.KinshipExample]:
    """The questions of the ``kinship-symbolic`` corpus: the task's questions over the trained
    chain lengths, from a stream of their own, without those ``held_out`` holds."""
    return kinship.reasoning_examples(num_documents, kinship.TRAIN_K, seed=seed,
                                      exclude=held_out)


def kinship_documents(kind: str, num_documents: int, seed: int,
                      held_out: kinship.HeldOut | None = None) -> list[list[str]]:
    """The embedded corpus ``kind`` (`EMBEDDED`) as documents, without the families and
    questions ``held_out`` holds (`folnet.train.data.kinship.heldout`): what ``--data kind``
    pretrains on, and what an ablation writes to a file with its test questions held out."""
    if kind not in EMBEDDED:
        raise FolnetError(f"{kind!r} is no embedded corpus; use {' or '.join(EMBEDDED)}")
    if kind == KINSHIP_SYMBOLIC:
        examples = kinship_examples(num_documents, seed, held_out)
        return list(kinship.symbolic_documents(examples))
    families = held_out.families if held_out is not None else ()
    return kinship.pretraining_documents(num_documents, seed=seed, exclude_families=families)


def _read_kinship(kind: str, num_documents: int, seed: int) -> Iterator[list[str]]:
    for document in kinship_documents(kind, num_documents, seed):
        sentences = [" ".join(str(s).split()) for s in document]
        sentences = [s for s in sentences if s]
        if sentences:
            yield sentences


def iter_documents(source: CorpusSource, *, kinship_documents: int = 2000, seed: int = 0,
                   text_column: str = "text", encoding: str = "utf-8") -> Iterator[list[str]]:
    """Yield each document of `source` as a list of sentences, lazily and in a fixed order.

    Paths are checked before this returns (a typo fails here, not mid-iteration); whether the
    files are text is checked as they are read (`folnet.train.data.sources`).
    """
    parts = resolve_sources(source)
    return read_documents(parts, kinship_documents=kinship_documents, seed=seed,
                          text_column=text_column, encoding=encoding)


def read_documents(parts: list[Part], *, kinship_documents: int = 2000, seed: int = 0,
                   text_column: str = "text", encoding: str = "utf-8") -> Iterator[list[str]]:
    """`iter_documents` for parts already checked by `resolve_sources`; records whose text
    holds no sentence are skipped."""
    for kind, path in parts:
        if path is None:  # only an embedded corpus has no path (resolve_sources)
            yield from _read_kinship(kind, kinship_documents, seed)
            continue
        warned = False
        for text in read_texts(kind, path, text_column, encoding):
            sentences, hard = _split(text, MAX_SENTENCE_CHARS)
            if hard and not warned:
                warned = True
                warnings.warn(f"corpus file {str(path)!r} has runs of more than "
                              f"{MAX_SENTENCE_CHARS} characters without whitespace; they are "
                              f"cut into pieces of {MAX_SENTENCE_CHARS} (each reads as [UNK])",
                              stacklevel=2)
            if sentences:
                yield sentences
