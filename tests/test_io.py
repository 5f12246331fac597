"""folnet.io: atomic writes of files and directories leave the old version or the new one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from folnet.io import atomic_write_dir, atomic_write_json, atomic_write_text, discard_dir


def names(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


def test_file_writes_replace_atomically(tmp_path):
    target = tmp_path / "sub" / "a.json"
    atomic_write_json(target, {"b": 1, "a": [1, 2]})
    assert json.loads(target.read_text()) == {"a": [1, 2], "b": 1}
    atomic_write_text(target, "new\n")
    assert target.read_text() == "new\n" and names(target.parent) == ["a.json"]


def test_directory_writes_replace_or_keep_and_a_failure_changes_nothing(tmp_path):
    target = tmp_path / "runs" / "step_3"

    def writer(text: str):
        def write(directory: Path) -> None:
            (directory / "model.txt").write_text(text)
            (directory / "nested").mkdir()
            (directory / "nested" / "x").write_text(text)
        return write

    assert atomic_write_dir(target, writer("one")) == target
    assert (target / "nested" / "x").read_text() == "one"
    atomic_write_dir(target, writer("two"))
    assert (target / "model.txt").read_text() == "two"
    atomic_write_dir(target, writer("three"), replace=False)  # a cache entry: keep the first
    assert (target / "model.txt").read_text() == "two"

    def half_then_crash(directory: Path) -> None:
        (directory / "model.txt").write_text("half")
        raise OSError("No space left on device")

    with pytest.raises(OSError, match="No space"):
        atomic_write_dir(target, half_then_crash)
    assert (target / "model.txt").read_text() == "two"
    assert names(target.parent) == ["step_3"]  # no temporary, no trash left behind

    discard_dir(target)
    assert names(target.parent) == []
