"""A real-English corpus for the tests, built from what this machine already has.

Tests of tokenisation and masking statistics are only meaningful on natural text (Zipfian word
frequencies, real sentence lengths), yet the project cannot ship a book or fetch one. Every
Python install carries a few megabytes of hand-written English: the docstrings of the standard
library, plus the language-reference topics behind `help()` (`pydoc_data.topics`), all under
the PSF licence. `write_english_corpus` collects them, one docstring per document, in a fixed
order, so a given interpreter always produces the same file (about 1.4 MB on CPython 3.11).

Output format (the `.txt` format that `folnet.train.data.corpus` reads): documents are separated by
a blank line and each line holds one paragraph (wrapped docstring lines are joined), because a
line break is treated as a sentence boundary by the corpus reader (`folnet.train.data.documents`).
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import inspect
import io
import os
import pkgutil
import re
import sys
import warnings
from collections.abc import Iterator
from functools import lru_cache
from pathlib import Path
from types import ModuleType

from folnet.errors import FolnetError

__all__ = ["stdlib_docstrings", "write_english_corpus"]

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
                if member_name.startswith("_") or _patched_in(member):
                    continue
                if inspect.isroutine(member) or isinstance(member, property):
                    member_doc = inspect.getdoc(member)
                    if member_doc:
                        yield member_doc


def _patched_in(member: object) -> bool:
    """A method another package added to a stdlib class (transformers adds ``warning_once``
    and others to `logging.Logger`): its function was defined outside the standard library,
    and the corpus must not depend on what else the process imported."""
    home = getattr(getattr(member, "fget", member), "__module__", None)
    return isinstance(home, str) and home.split(".")[0] not in _STDLIB


_STDLIB = frozenset(sys.stdlib_module_names) | {"builtins"}


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
