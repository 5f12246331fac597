"""Reading data files: TOML (tomllib on 3.11+, tomli before), JSON and CSV/TSV, every fault a
`FolnetError` naming the file; and the location of the bundled folnet/specs/.

Why the JSON and CSV helpers: the standard library's parsers fail on hostile or unlucky input
with exceptions that name no file and that an ``except ValueError`` does not catch -- a
`RecursionError` for JSON nested a few thousand levels deep, a `csv.Error` for a field past
the csv module's size limit (131,072 characters by default) -- and the command line then
printed a traceback. `parse_json` and `csv_rows` turn both into one line naming the file.
"""

from __future__ import annotations

import csv
import json
import os
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from folnet.errors import FolnetError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib


def loads(text: str, *, source: str = "<string>") -> dict[str, Any]:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise FolnetError(f"{source}: invalid TOML: {exc}") from None


def load(path: str | os.PathLike[str]) -> dict[str, Any]:
    path = Path(path)
    if not path.is_file():
        raise FolnetError(f"TOML file {str(path)!r} does not exist")
    return loads(path.read_text(encoding="utf-8"), source=str(path))


def read_json(path: str | os.PathLike[str], *, what: str = "JSON file") -> Any:
    """The JSON document at ``path``; a missing file or bad JSON is a `FolnetError` saying
    ``what`` the file was meant to be."""
    path = Path(path)
    if not path.is_file():
        raise FolnetError(f"{what} {str(path)!r} does not exist")
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:  # unreadable: permissions, a folder's name, an I/O error
        raise FolnetError(f"cannot read {what} {str(path)!r}: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise FolnetError(f"{path}: not valid JSON ({exc})") from None
    try:
        return parse_json(text, str(path))
    except json.JSONDecodeError as exc:
        raise FolnetError(f"{path}: not valid JSON ({exc})") from None


def parse_json(text: str, source: str) -> Any:
    """``json.loads(text)``, with nesting deeper than the parser follows a `FolnetError` naming
    ``source``. Why: the parser recurses once per level of arrays and objects, so a document
    nested past Python's recursion limit (1,000 by default) raises `RecursionError`, which is
    no `ValueError` and escaped every reader's handling as a traceback. A `JSONDecodeError`
    passes through unchanged: each reader words it with its own position (a file's line, the
    number of a JSON line)."""
    try:
        return json.loads(text)
    except RecursionError:
        raise FolnetError(f"{source}: not valid JSON (nested too deeply): more levels of arrays "
                          f"and objects than Python's parser follows (its recursion limit, "
                          f"{sys.getrecursionlimit():,})") from None


#: The longest CSV/TSV field, in characters, that `csv_rows` reads: far above any real field
#: (a GLUE sentence, a CLUTRR story: a few thousand characters at most), yet it bounds what an
#: opening quote without its closing one reads into one field before the error says so.
CSV_FIELD_LIMIT = 1 << 20


def csv_rows(handle: Iterable[str], source: str, **dialect: Any
             ) -> Iterator[tuple[int, list[str]]]:
    """(1-based line where the record starts, its fields) for every record -- blank lines
    included, as ``[]`` -- of an open CSV/TSV file read with ``csv.reader(handle,
    **dialect)``.

    Fields of up to `CSV_FIELD_LIMIT` characters are read (the csv module's own limit, 131,072
    by default, is raised while a record is parsed and restored after, so the process-wide
    setting is left as it was; a higher one is kept). A longer field, or anything else the
    csv module refuses, is a `FolnetError` naming ``source``, the line and the limit, not a
    bare `csv.Error`."""
    reader = csv.reader(handle, **dialect)
    quoted = dialect.get("quoting", csv.QUOTE_MINIMAL) != csv.QUOTE_NONE
    start = 1
    while True:
        limit = max(csv.field_size_limit(), CSV_FIELD_LIMIT)
        before = csv.field_size_limit(limit)
        try:
            fields = next(reader)
        except StopIteration:
            return
        except csv.Error as exc:
            if "field larger than field limit" in str(exc):
                hint = ("; a quote character that opens a field without closing it makes the "
                        "rest of the file one field" if quoted else "")
                raise FolnetError(f"{source}:{start}: a field is longer than {limit:,} "
                                  f"characters, the most a field may have{hint}") from None
            raise FolnetError(f"{source}:{start}: not valid CSV ({exc})") from None
        finally:
            csv.field_size_limit(before)
        yield start, fields
        start = reader.line_num + 1


def specs_dir() -> Path:
    """The bundled specs directory: ``$FOLNET_SPECS`` if set, else ``folnet/specs`` found
    through `importlib.resources`.

    The specs live inside the package, so one lookup serves a wheel, an editable install and a
    source checkout on ``PYTHONPATH`` alike (a lookup by a path relative to the checkout found
    nothing in a wheel). A zip-imported folnet has no directory to hand out, and says so.
    """
    override = os.environ.get("FOLNET_SPECS")
    if override:
        return Path(override)
    from importlib.resources import files

    bundled = files("folnet").joinpath("specs")
    if not isinstance(bundled, Path):
        raise FolnetError(f"folnet's bundled specs are at {bundled!r}, not on a file system; "
                          "install folnet unzipped (pip does) or set FOLNET_SPECS")
    return bundled


def bundled_or_path(path: str | os.PathLike[str], folder: str, *, what: str) -> Path:
    """``path`` if it is a file, else the bundled ``folnet/specs/FOLDER/NAME.toml`` when
    ``path`` is a bare NAME (no suffix, no folder); anything else is a `FolnetError` naming
    ``what`` (the flag or argument), the value and the bundled names.

    Why: a user of the installed package has no checkout, so ``--config
    folnet/specs/train/kinship-tiny.toml`` names nothing on their disk; ``--config
    kinship-tiny`` reads the same file wherever folnet is installed.
    """
    given = Path(path)
    if given.is_file():
        return given
    candidate = specs_dir() / folder / f"{given.name}.toml"
    if given.name == str(path) and not given.suffix and candidate.is_file():
        return candidate
    names = sorted(p.stem for p in (specs_dir() / folder).glob("*.toml"))
    raise FolnetError(f"{what} {str(path)!r} does not exist, nor is it a bundled name "
                      f"({', '.join(names)})")
