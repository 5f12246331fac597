"""Reading data files: TOML (tomllib on 3.11+, tomli before) and JSON, every fault a
`FolnetError` naming the file; and the location of the bundled specs/."""

from __future__ import annotations

import json
import os
import sys
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
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise FolnetError(f"{path}: not valid JSON ({exc})") from None
    except RecursionError:  # nesting deeper than the parser's stack
        raise FolnetError(f"{path}: not valid JSON (nested too deeply)") from None


def specs_dir() -> Path:
    """The specs/ directory: $FOLNET_SPECS, the source checkout, or the installed copy."""
    override = os.environ.get("FOLNET_SPECS")
    if override:
        return Path(override)
    checkout = Path(__file__).resolve().parent.parent / "specs"
    if (checkout / "operators.toml").is_file():
        return checkout
    try:
        from importlib.resources import files

        return Path(str(files("folnet.specs")))
    except (ModuleNotFoundError, TypeError):  # pragma: no cover
        return checkout
