"""Size and scale expressions of operator specs ("H*S", "2*D2", "S**-0.25").

Operator specs state projection widths and scalings in terms of the model's dimensions so that
one spec serves every model size. Expressions are parsed with `ast` and evaluated over a closed
set of names and arithmetic operators: nothing from a spec file is ever `eval`-ed.
"""

from __future__ import annotations

import ast
import functools
import operator

from folnet.errors import FolnetError, choices

#: Names a size expression may use: the model dimensions (docs/design.md section 2).
DIM_NAMES = ("D1", "D2", "H", "S", "F1", "F2")

_BINARY = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Pow: operator.pow,
}


@functools.lru_cache(maxsize=512)
def _parse(text: str) -> ast.expr:
    try:
        tree = ast.parse(text.strip(), mode="eval").body
    except SyntaxError as exc:
        raise FolnetError(f"cannot parse expression {text!r}: {exc.msg}") from None
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            if node.id not in DIM_NAMES:
                raise FolnetError(
                    f"unknown name {node.id!r} in expression {text!r}; use {choices(DIM_NAMES)}"
                )
        elif isinstance(node, ast.Constant):
            if not isinstance(node.value, (int, float)) or isinstance(node.value, bool):
                raise FolnetError(f"only numbers are allowed in expression {text!r}")
        elif isinstance(node, ast.BinOp):
            if type(node.op) not in _BINARY:
                raise FolnetError(f"operator {type(node.op).__name__} not allowed in {text!r}")
        elif isinstance(node, ast.UnaryOp):
            if not isinstance(node.op, (ast.USub, ast.UAdd)):
                raise FolnetError(f"operator {type(node.op).__name__} not allowed in {text!r}")
        elif not isinstance(node, (ast.operator, ast.unaryop, ast.Load, ast.expr_context)):
            raise FolnetError(f"{type(node).__name__} not allowed in expression {text!r}")
    return tree


def check_expression(text: str) -> None:
    """Raise `FolnetError` unless ``text`` is a valid size/scale expression."""
    _parse(text)


def evaluate(text: str, dims: dict[str, int | float]) -> float:
    """Evaluate an expression with the model dimensions ``dims`` (missing names are an error)."""

    def walk(node: ast.expr) -> float:
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, ast.Name):
            if node.id not in dims:
                raise FolnetError(f"expression {text!r} needs {node.id}, which is not set")
            return dims[node.id]
        if isinstance(node, ast.BinOp):
            return _BINARY[type(node.op)](walk(node.left), walk(node.right))
        if isinstance(node, ast.UnaryOp):
            value = walk(node.operand)
            return -value if isinstance(node.op, ast.USub) else value
        raise FolnetError(f"cannot evaluate {text!r}")  # unreachable after _parse

    return walk(_parse(text))


def evaluate_int(text: str, dims: dict[str, int | float], *, what: str) -> int:
    """Evaluate a width: it must come out a positive integer."""
    value = evaluate(text, dims)
    if value != int(value) or value < 1:
        raise FolnetError(f"{what} = {text!r} evaluates to {value}, expected a positive integer")
    return int(value)


def channel_sizes(spec_sizes: tuple[tuple[str, str], ...], dims: dict[str, int | float],
                  *, symbol: str = "?") -> dict[str, int]:
    """The width of every channel letter of an operator (its spec's ``sizes``) for a model's
    dimensions, e.g. ``{"h": 12, "s": 64}``."""
    return {c: evaluate_int(e, dims, what=f"operator {symbol!r} size of {c}")
            for c, e in spec_sizes}
