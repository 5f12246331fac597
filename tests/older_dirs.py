"""Directories as an earlier folnet wrote them, made from ones this folnet wrote."""

from __future__ import annotations

import json
from pathlib import Path

from folnet.checksums import MANIFEST, MANIFEST_PROMISE


def as_written_before_checksums(directory: Path) -> None:
    """No checksums.json, and no config.json key saying one was written: a directory from
    before folnet recorded checksums (which loads with a warning, where one that lost its
    manifest is refused)."""
    (directory / MANIFEST).unlink()
    config = directory / "config.json"
    if config.is_file():
        data = json.loads(config.read_text())
        if data.pop(MANIFEST_PROMISE, None) is not None:
            config.write_text(json.dumps(data, indent=2))
