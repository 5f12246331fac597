"""Every ``folnet.x.y`` a docstring, a test, a benchmark or a documentation page names in
backticks is an importable object: a module moved or a function renamed without its mentions
fails here. The old import paths the changelog lists as moved are the exception, and they must
really be gone (a listed path that still imports is no longer an old one)."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

from paths import ROOT

NAME = re.compile(r"`{1,2}(folnet(?:\.\w+)+)(?:\(\))?`{1,2}")
#: The paths a moved module had, named where the changes are told (README, CHANGELOG).
MOVED = {"folnet.arch.official", "folnet.files", "folnet.io", "folnet.train.engine.checkpoints",
         "folnet.train.finetune.checkpoint", "folnet.arch.stack", "folnet.arch.memory",
         "folnet.arch.kvcache", "folnet.arch.layer.blocked"}
CHANGES = ("README.md", "CHANGELOG.md", "docs/changelog.md")


def _resolves(name: str) -> bool:
    """Whether ``name`` is a module, or an attribute path under the longest importable one."""
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for attr in parts[cut:]:
            if not hasattr(obj, attr):
                return False
            obj = getattr(obj, attr)
        return True
    return False


def _sources() -> list[Path]:
    files = [p for folder in ("folnet", "tests", "benchmarks", "examples", "docs")
             for p in (ROOT / folder).rglob("*") if p.suffix in (".py", ".md")]
    files = [p for p in files if p != Path(__file__).resolve()]  # its own examples are stale
    return files + [ROOT / name for name in CHANGES[:2]]


def _unresolved(files: list[Path], root: Path = ROOT) -> dict[str, list[str]]:
    found: dict[str, set[str]] = {}
    for path in files:
        if not path.is_file():
            continue
        where = path.relative_to(root).as_posix()
        for match in NAME.finditer(path.read_text(encoding="utf-8")):
            name = match.group(1)
            if name in MOVED and where in CHANGES:
                continue
            if not _resolves(name):
                found.setdefault(name, set()).add(where)
    return {name: sorted(places) for name, places in sorted(found.items())}


def test_every_named_object_resolves():
    assert _unresolved(_sources()) == {}


def test_the_moved_paths_are_gone():
    assert sorted(name for name in MOVED if _resolves(name)) == []


def test_a_stale_name_is_caught(tmp_path):
    stale = tmp_path / "stale.md"
    stale.write_text("See `folnet.arch.layer.memory_modes.AUTO_MIN_T` and ``folnet.arch.memory``, "
                     "and `folnet.ops.primitives.sink.nothing_here()`.\n", encoding="utf-8")
    assert _unresolved([stale], tmp_path) == {
        "folnet.arch.memory": ["stale.md"],
        "folnet.ops.primitives.sink.nothing_here": ["stale.md"]}


#: A project issue cited by number ("issue 30", "(issue 19, problem 4)"); another project's
#: issue is cited with its repository before the number.
ISSUE = re.compile(r"(?<!\w)[Ii]ssue \d+")


def _issue_citations(files: list[Path], root: Path = ROOT) -> list[str]:
    found = []
    for path in files:
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            for match in ISSUE.finditer(line):
                words = line[:match.start()].split()
                if not (words and "/" in words[-1]):  # "owner/repo issue N" is another's
                    found.append(f"{path.relative_to(root).as_posix()}:{number}")
    return found


def _code_files() -> list[Path]:
    return [p for folder in ("folnet", "tests", "benchmarks", "examples")
            for p in (ROOT / folder).rglob("*") if p.suffix in (".py", ".toml")
            and "__pycache__" not in p.parts and p != Path(__file__).resolve()]


def test_no_issue_numbers_in_the_code():
    """The repository does not hold the issues: a reader cannot follow the number."""
    assert _issue_citations(_code_files()) == []


def test_an_issue_number_is_caught(tmp_path):
    cited = tmp_path / "cited.py"
    cited.write_text("# fixed (issue 30)\n# see huggingface/tokenizers issue 1794\n")
    assert _issue_citations([cited], tmp_path) == ["cited.py:1"]
