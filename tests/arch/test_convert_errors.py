"""``folnet convert`` handed a ``.pt`` that is not the state dict it converts: each
fault is one line on stderr, exit status 2, naming the file, what is wrong with it and what was
expected -- never torch's paragraph, a C++ assertion, or a traceback -- and nothing is written;
an output folder that cannot be one is one line too. (tests/project/test_hostile_inputs.py
covers pickles that would run code.)"""

from __future__ import annotations

import shutil
import struct
import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from paths import OFFICIAL as RELEASED

from folnet.cli import main

#: What every refusal of an unreadable file says was expected.
EXPECTED = "expected a torch.save of a dict of parameter names to tensors"


class Thing:
    """An arbitrary object where a state dict belongs."""


def _released_bytes() -> bytes:
    return Path(f"{RELEASED}.pt").read_bytes()


def _corrupt_member(path: Path) -> None:
    """The released file with one byte changed inside a tensor's stored data: the zip stays
    whole, only that member's CRC no longer matches."""
    data = bytearray(_released_bytes())
    with zipfile.ZipFile(f"{RELEASED}.pt") as archive:
        member = next(i for i in archive.infolist() if "/data/" in i.filename
                      and i.file_size > 64)
    start = member.header_offset
    name_length, extra_length = struct.unpack("<HH", data[start + 26:start + 30])
    data[start + 30 + name_length + extra_length + member.file_size // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def _zip_of_text(path: Path) -> None:
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("weights.txt", "0.1 0.2 0.3\n")


#: name -> (how the .pt is made, what the one line must say besides the file and EXPECTED)
CASES: dict[str, tuple[Callable[[Path], object], tuple[str, ...]]] = {
    "an object": (lambda p: torch.save(Thing(), p), ("Unsupported global", EXPECTED)),
    "non-tensor values": (lambda p: torch.save({"w": [0.5], "name": "x"}, p),
                          ("'w' (list), 'name' (str)", "parameter names to tensors")),
    "a list": (lambda p: torch.save([torch.zeros(2)], p), ("expected a state dict, got list",)),
    "a truncated file": (lambda p: p.write_bytes(_released_bytes()[:4096]),
                         ("truncated zip archive", EXPECTED)),
    "a file cut short at its end": (lambda p: p.write_bytes(_released_bytes()[:-64]),
                                    ("truncated zip archive", EXPECTED)),
    "a zip of something else": (_zip_of_text, ("torch.save did not write", "'weights.txt'",
                                               EXPECTED)),
    "a corrupt member": (_corrupt_member, ("fails its CRC check", EXPECTED)),
    "an empty file": (lambda p: p.write_bytes(b""), ("an empty file", EXPECTED)),
    "a directory": (lambda p: p.mkdir(), ("are not a file",)),
}


@pytest.mark.parametrize("case", list(CASES))
def test_convert_of_a_file_that_is_no_state_dict_is_one_line(tmp_path, capsys, case):
    make, says = CASES[case]
    prefix = tmp_path / "released"
    shutil.copyfile(f"{RELEASED}.cfg", f"{prefix}.cfg")
    weights = Path(f"{prefix}.pt")
    make(weights)
    capsys.readouterr()
    code = main(["convert", str(prefix), str(tmp_path / "out")])
    captured = capsys.readouterr()
    assert code == 2, captured
    assert "Traceback" not in captured.err and "enforce fail" not in captured.err
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("folnet convert: error: "), captured.err
    assert str(weights) in lines[0] and all(part in lines[0] for part in says), lines[0]
    assert "weights_only=False" not in lines[0] and "\x1b" not in lines[0]
    assert not (tmp_path / "out").exists()


def test_the_released_file_itself_still_converts(tmp_path, capsys):
    """The checks before torch reads the file pass the file torch.save wrote."""
    assert main(["convert", str(RELEASED), str(tmp_path / "out")]) == 0
    assert (tmp_path / "out" / "model.safetensors").is_file()
    capsys.readouterr()


@pytest.mark.parametrize("where", ["a file", "inside a file"])
def test_an_outdir_that_cannot_be_a_directory_is_one_line(tmp_path, capsys, where):
    blocker = tmp_path / "taken"
    blocker.write_text("not a folder\n")
    outdir = blocker if where == "a file" else blocker / "out"
    capsys.readouterr()
    assert main(["convert", str(RELEASED), str(outdir)]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("folnet convert: error: "), err
    assert str(outdir) in lines[0]
    assert ("is not a directory" if where == "a file" else "[ENOTDIR]") in lines[0], lines[0]
    assert blocker.read_text() == "not a folder\n"
