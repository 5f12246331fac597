"""Copies of a saved model directory with config.json edited: the config tests' shared helper
(arch/test_config_checks.py, arch/test_hostile_config.py)."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from folnet.checksums import MANIFEST_PROMISE


def edited_copy(saved: Path, where: Path, change: Callable[[dict], Any]) -> Path:
    """A copy of the model directory ``saved`` under ``where`` whose config.json went through
    ``change(meta)``."""
    target = where / "edited"
    shutil.copytree(saved, target)
    # a hand-edited directory: its manifest would refuse the edit before the config checks,
    # and so would the config's word that folnet wrote one
    (target / "checksums.json").unlink(missing_ok=True)
    meta = json.loads((target / "config.json").read_text())
    meta.pop(MANIFEST_PROMISE, None)
    change(meta)
    (target / "config.json").write_text(json.dumps(meta))
    return target


def setter(field: str, value: Any) -> Callable[[dict], None]:
    """A change for `edited_copy` that sets the dotted ``field`` (``"model.D1"``) to ``value``."""

    def change(meta: dict) -> None:
        *outer, last = field.split(".")
        node = meta
        for key in outer:
            node = node[key]
        node[last] = value

    return change
