"""folnet.atomic_write: writes of files and directories leave the old version or the new one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from folnet.atomic_write import atomic_write_dir, atomic_write_json, atomic_write_text, discard_dir


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


def test_read_json_faults_are_one_error_naming_the_file(tmp_path, monkeypatch):
    from folnet.errors import FolnetError
    from folnet.read_files import read_json

    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000, encoding="utf-8")
    with pytest.raises(FolnetError, match=r"deep\.json: not valid JSON \(nested too deeply\)"):
        read_json(deep)
    locked = tmp_path / "config.json"
    locked.write_text("{}", encoding="utf-8")

    def refuse(self, *args, **kwargs):
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr(Path, "read_text", refuse)  # as root, chmod 000 would not refuse
    with pytest.raises(FolnetError, match=r"cannot read model config '.*config\.json': "
                                          r"Permission denied"):
        read_json(locked, what="model config")
