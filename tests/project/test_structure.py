"""The code's shape, as the project's habits set it: no function over 80 lines, no import
cycle among folnet's modules (imports inside functions count), and no folnet module loaded by a
string name (``importlib.import_module("folnet...")``), which hides an edge from both."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "folnet"
MAX_FUNCTION_LINES = 80


def _modules() -> dict[str, Path]:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


MODULES = _modules()
TREES = {name: ast.parse(path.read_text(encoding="utf-8")) for name, path in MODULES.items()}


def _imports(name: str) -> set[str]:
    """The folnet modules ``name`` imports, anywhere in it (a name from a module counts as that
    module; a package's import of its own parts is not an edge back to it)."""
    package = name if MODULES[name].name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(TREES[name]):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([base] if base else []))
            targets = [base] + [f"{base}.{alias.name}" for alias in node.names]
        else:
            continue
        for target in targets:
            while target and target not in MODULES:
                target = target.rpartition(".")[0]
            if target and target != name and not name.startswith(target + "."):
                found.add(target)
    return found


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            step = next(edges, None)
            if step is not None:
                if step not in index:
                    index[step] = low[step] = len(index)
                    stack.append(step)
                    on_stack.add(step)
                    work.append((step, iter(sorted(graph[step]))))
                elif step in on_stack:
                    low[node] = min(low[node], index[step])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                group = []
                while True:
                    top = stack.pop()
                    on_stack.discard(top)
                    group.append(top)
                    if top == node:
                        break
                if len(group) > 1:
                    groups.append(sorted(group))
    return groups


def test_no_import_cycle_among_folnets_modules():
    graph = {name: _imports(name) for name in MODULES}
    assert _cycles(graph) == []


def test_the_cycle_finder_finds_a_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _cycles(graph) == [["a", "b", "c"]]


def test_the_command_modules_are_imported_by_name_where_the_checker_sees_them():
    graph = {name: _imports(name) for name in MODULES}
    assert {"folnet.train.pretrain.cli", "folnet.train.finetune.cli",
            "folnet.train.ablate.cli"} <= graph["folnet.cli"]
    assert "folnet.cli" not in graph["folnet.train.pretrain.cli"]


def _string_imports(tree: ast.AST) -> list[str]:
    """The literal folnet module names passed to ``import_module`` or ``__import__``."""
    names = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or not node.args:
            continue
        func = node.func
        called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        first = node.args[0]
        if called in ("import_module", "__import__") and isinstance(first, ast.Constant) \
                and str(first.value).startswith("folnet"):
            names.append(first.value)
    return names


def test_no_folnet_module_is_loaded_by_a_string_name():
    found = {name: _string_imports(tree) for name, tree in TREES.items()}
    assert {name: hits for name, hits in found.items() if hits} == {}


def test_the_string_import_finder_finds_one():
    tree = ast.parse("import importlib\nimportlib.import_module('folnet.train.pretrain.cli')\n")
    assert _string_imports(tree) == ["folnet.train.pretrain.cli"]


@pytest.mark.parametrize("name", sorted(MODULES))
def test_no_function_is_longer_than_80_lines(name):
    long = [(node.name, node.lineno, node.end_lineno - node.lineno + 1)
            for node in ast.walk(TREES[name])
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES]
    assert long == [], f"{MODULES[name].relative_to(ROOT)}: (name, line, lines) {long}"
