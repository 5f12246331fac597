"""The glossary's words and the code's names kept in step (docs/getting-started/glossary.md).

Its "Words of the code" table is the code's own vocabulary beside the paper's: every word there
must still be a name in the code, every file it gives must exist, and every word of
`VOCABULARY` -- the words a review found the code using beyond the paper's notation -- that a
name in folnet uses must be defined there. "kernel" is the paper's K tensor: no module or
package of folnet is named for it."""

from __future__ import annotations

import ast
import re

from paths import ROOT

GLOSSARY = ROOT / "docs" / "getting-started" / "glossary.md"
PACKAGE = ROOT / "folnet"
#: Words outside the paper's notation that names in the code have used (the review's list,
#: and the words that replaced some of them); a name that uses one needs its glossary entry.
VOCABULARY = ("slab", "sink", "prologue", "reach", "redraw", "redrawn", "premasked", "lean",
              "hand_back", "release_heap", "memory_mode", "memory_budget", "primitive",
              "op_call", "layer_call")


def _rows(section: str) -> dict[str, str]:
    """word -> meaning of the glossary table under the heading ``section``."""
    text = GLOSSARY.read_text(encoding="utf-8")
    body = text.split(f"## {section}\n", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in body.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 2 and cells[0].startswith("**"):
            rows[cells[0].strip("*").split("**")[0].strip()] = cells[1]
    return rows


def _defined() -> set[str]:
    """Every word the glossary defines in bold, as the code spells it (spaces as '_')."""
    text = GLOSSARY.read_text(encoding="utf-8")
    return {word.strip().lower().replace(" ", "_") for word in re.findall(r"\*\*([^*]+)\*\*",
                                                                          text)}


def _names() -> set[str]:
    """Every identifier folnet defines or uses: modules, classes, functions, arguments,
    attributes, variables and keywords."""
    names = set()
    for path in PACKAGE.rglob("*.py"):
        names.add(path.stem)
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, ast.Name):
                names.add(node.id)
            elif isinstance(node, ast.Attribute):
                names.add(node.attr)
            elif isinstance(node, ast.arg):
                names.add(node.arg)
            elif isinstance(node, ast.keyword) and node.arg:
                names.add(node.arg)
    for path in PACKAGE.rglob("*"):
        if path.is_dir():
            names.add(path.name)
    return names


def _snake(name: str) -> str:
    """``RedrawnScale`` -> ``redrawn_scale``; ``_sink_apply`` -> ``sink_apply``."""
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", name).lower().strip("_")


def _uses(word: str, names: set[str]) -> list[str]:
    """The names that use ``word`` as one or more whole parts of their snake-case form."""
    pattern = re.compile(rf"(^|_){re.escape(word)}s?(_|$)")
    return sorted(n for n in names if pattern.search(_snake(n)))


NAMES = _names()


def test_every_word_of_the_codes_table_is_a_name_in_the_code():
    words = _rows("Words of the code")
    assert len(words) >= 8, words
    unused = {w: m for w, m in words.items() if not _uses(w.replace(" ", "_"), NAMES)}
    assert unused == {}


def test_every_file_the_glossary_gives_exists():
    """(Its dotted folnet names are resolved with every other page's in test_names.py.)"""
    text = GLOSSARY.read_text(encoding="utf-8")
    paths = re.findall(r"`((?:folnet|tests)/[\w/.]+)`", text)
    assert paths, "the glossary gives no file"
    assert [p for p in paths if not (ROOT / p).exists()] == []


def test_every_word_of_the_codes_own_vocabulary_in_use_is_defined():
    defined = _defined()
    undefined = {w: _uses(w, NAMES)[:5] for w in VOCABULARY
                 if _uses(w, NAMES) and w not in defined}
    assert undefined == {}


def test_the_finder_sees_a_word_inside_a_name():
    names = {"_RedrawnScale", "hand_back", "block_reach", "clean", "Boolean", "sinks"}
    assert _uses("redrawn", names) == ["_RedrawnScale"]
    assert _uses("lean", names) == []  # a part, not a substring
    assert _uses("reach", names) == ["block_reach"]
    assert _uses("sink", names) == ["sinks"]
    assert _uses("hand_back", names) == ["hand_back"]


def test_no_module_or_package_is_named_for_the_operators_kernel():
    sources = [p.relative_to(ROOT) for p in PACKAGE.rglob("*.py")]
    named = sorted(str(p) for p in sources
                   if {"kernel", "kernels"} & {p.stem, *p.parent.parts})
    assert named == []

