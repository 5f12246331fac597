"""folnet's docstrings and comments say what the code does and why, not what was measured on
which day: no dates, no commits to compare with, no timings or speed ratios, no history of the
code ("as before", "used to"). The figures behind a choice live in
docs/results/measurements.md, with their date, machine and command; the history in
CHANGELOG.md. A note here would go stale where nobody renders or dates it.

Every ``folnet/**/*.py`` is read with `ast` (every string statement: module, class, function
and attribute docstrings) and `tokenize` (every comment, ``#:`` included; a run of comments on
consecutive lines is read as one text, so a phrase broken over two lines is still seen)."""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

from paths import ROOT

#: What a note looks like, by kind. Case-insensitive, except a commit's hex digits.
PATTERNS = {
    "date": re.compile(r"\b20\d\d-\d\d\b"),
    # a commit compared with or started from: 7+ hex digits, at least one digit and one letter
    "commit": re.compile(r"\b(?i:at|against|since|from)\s+"
                         r"(?=[0-9a-f]*[0-9])(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}\b"),
    # "is used to compute" says what a thing is for, not what the code once did
    "history": re.compile(r"\b(?:as before|(?<!\bis )(?<!\bare )(?<!\bbe )(?<!\bbeen )"
                          r"(?<!\bbeing )used to|no longer|previously|formerly|than before"
                          r"|once\s+(?:was|were|used|did|had|took|ran)"
                          r"|were\b[^.;:]{0,60}?\bbefore)\b", re.IGNORECASE),
    # a figure with a time unit: "2.05 s", "37 ms", "205 us", "1.2s"; not "the 10^5s"
    "timing": re.compile(r"(?<![\w.^])\d+(?:[.,]\d+)?\s?(?:ms|us|µs|s|secs?|seconds?"
                         r"|minutes?|mins?|hours?)\b", re.IGNORECASE),
    "ratio": re.compile(r"\d+(?:\.\d+)?\s?(?:x|×|%|\s+times)\s+(?:faster|slower|quicker"
                        r"|longer|shorter|more|less|fewer|higher|lower|larger|smaller"
                        r"|the\s+(?:cost|time|speed))\b", re.IGNORECASE),
    "measured": re.compile(r"\bmeasured\b", re.IGNORECASE),
}
#: A duration a parameter defaults to ("30 minutes by default", "default 300 s") is the
#: parameter's meaning, not a measurement.
DEFAULT_BEFORE = re.compile(r"\bdefaults?(?: is| of| to)?:?\s*~?$", re.IGNORECASE)
DEFAULT_AFTER = re.compile(r"^,?\s+by\s+default\b", re.IGNORECASE)


def _texts(source: str) -> list[tuple[int, str]]:
    """(first line, text) of every docstring and every run of comments in ``source``."""
    texts = []
    for node in ast.walk(ast.parse(source)):
        if (isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
                and isinstance(node.value.value, str)):
            texts.append((node.lineno, node.value.value))
    comments: list[tuple[int, str]] = []
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            line, text = token.start[0], token.string.lstrip("#").lstrip(":")
            if comments and comments[-1][0] + comments[-1][1].count("\n") == line - 1:
                comments[-1] = (comments[-1][0], comments[-1][1] + "\n" + text)
            else:
                comments.append((line, text))
    return texts + comments


def _is_default(text: str, match: re.Match[str]) -> bool:
    return bool(DEFAULT_BEFORE.search(text[:match.start()])
                or DEFAULT_AFTER.match(text[match.end():]))


def notes(files: list[Path], root: Path = ROOT) -> list[str]:
    """``file:line: matched text`` for every note in ``files``' docstrings and comments."""
    found = []
    for path in files:
        where = path.relative_to(root).as_posix()
        for first, text in _texts(path.read_text(encoding="utf-8")):
            for kind, pattern in PATTERNS.items():
                for match in pattern.finditer(text):
                    if kind == "timing" and _is_default(text, match):
                        continue
                    line = first + text.count("\n", 0, match.start())
                    found.append((where, line, " ".join(match.group(0).split())))
    return [f"{where}:{line}: {text}" for where, line, text in sorted(found)]


def test_no_dated_notes_measurements_or_history_in_folnet():
    files = sorted(p for p in (ROOT / "folnet").rglob("*.py") if "__pycache__" not in p.parts)
    found = notes(files)
    assert not found, (f"{len(found)} notes in folnet's docstrings and comments (the figures "
                       "belong in docs/results/measurements.md, the history in CHANGELOG.md):\n"
                       + "\n".join(found))


def test_a_note_is_caught(tmp_path):
    noted = tmp_path / "noted.py"
    noted.write_text(
        '"""Blocked (measured on an H200, 2026-11-27: 11x\nslower), as before."""\n'
        "X = 1  # took 2.05 s against 1.40 s at f00006c\n"
        "#: the step used to\n#: take 37 ms; 20% faster than a copy\n"
        "def f():\n    '''Ran 3x faster since 1b29dee, ~50x the cost of an add, as it once\n"
        "    was.'''\n", encoding="utf-8")
    assert notes([noted], tmp_path) == [
        "noted.py:1: 11x slower", "noted.py:1: 2026-11", "noted.py:1: measured",
        "noted.py:2: as before",
        "noted.py:3: 1.40 s", "noted.py:3: 2.05 s", "noted.py:3: at f00006c",
        "noted.py:4: used to", "noted.py:5: 20% faster", "noted.py:5: 37 ms",
        "noted.py:7: 3x faster", "noted.py:7: 50x the cost", "noted.py:7: once was",
        "noted.py:7: since 1b29dee"]


def test_what_is_not_a_note_passes(tmp_path):
    plain = tmp_path / "plain.py"
    plain.write_text(
        '"""The mask is used to pick rows; P in the 10^5s. The group\'s timeout (30 minutes by\n'
        'default), `connect_timeout` (default 300 s). Read from abcdefg or 1234567."""\n'
        "s = 2  # 2 blocks of 1 MiB chunks, at most 80% of the memory\n", encoding="utf-8")
    assert notes([plain], tmp_path) == []
