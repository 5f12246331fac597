"""TOML reading (tomllib on 3.11+, tomli before) and the location of the bundled specs/."""

from __future__ import annotations

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
