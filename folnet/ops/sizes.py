"""Size and scale expressions of operator specs ("H*S", "2*D2", "S**-0.25").

Operator specs state projection widths and scalings in terms of the model's dimensions so that
one spec serves every model size. Expressions are parsed with `ast` and evaluated over a closed
set of names and arithmetic operators: nothing from a spec file is ever `eval`-ed.

Not running code is not enough: a spec can arrive inside a stranger's config.json, and plain
arithmetic can still hang (``9**9**9`` has 370 million digits), overflow, divide by zero, turn
complex (``(0-8)**0.5``) or yield a width torch cannot unpack (``D2*2**62``). So every
expression is bounded *before* it is computed, and every fault is a `FolnetError` naming the
field and the expression:

* the text is at most `MAX_CHARS` characters, its tree at most `MAX_NODES` nodes and
  `MAX_DEPTH` levels deep (a 10,000-deep ``((((...))))`` is refused before the parser sees it);
* every number -- literal, dimension or intermediate result -- is a finite real number of
  magnitude at most `MAX_MAGNITUDE` (2**53: below it every integer is exact in a float, so a
  width computed through ``/`` stays the integer it should be);
* an exponent is at most `MAX_EXPONENT` in magnitude, and ``base**exponent`` is refused when
  its magnitude would pass `MAX_MAGNITUDE`, judged from logarithms before the power is taken;
  division by zero and a negative base to a fractional power are refused;
* a size (`evaluate_int`) is an integer in [1, `MAX_SIZE`] and the sizes of one operator
  multiply to at most `MAX_WIDTH` (`channel_sizes`), so no implied tensor has a dimension or an
  element count that overflows torch's 64-bit sizes; a scale (`evaluate_scale`) is a number in
  [`MIN_SCALE`, `MAX_MAGNITUDE`].
"""

from __future__ import annotations

import ast
import functools
import math
import operator
from collections.abc import Callable, Mapping

from folnet.errors import FolnetError, choices

#: Names a size expression may use: the model dimensions (docs/design.md section 2).
DIM_NAMES = ("D1", "D2", "H", "S", "F1", "F2")

#: The longest expression text: real ones are a few characters ("S**-0.25", "H*S"); the bound
#: is checked before parsing, which keeps the parser's recursion and the parse cache small.
MAX_CHARS = 256
#: The most expression nodes (numbers, names, operations) and the deepest nesting of a tree.
MAX_NODES = 64
MAX_DEPTH = 16
#: The largest exponent magnitude: enough for any power of two a width needs.
MAX_EXPONENT = 64
#: The largest magnitude of any number in an expression (2**53: integers stay exact in floats).
MAX_MAGNITUDE = 2**53
#: The smallest scale: the reciprocal of `MAX_MAGNITUDE`.
MIN_SCALE = 2.0**-53
#: The largest size of one channel letter: 2**26 = 1024 * 65536, the largest ``H*S`` the model
#: config's own limits allow (`folnet.arch.config.SIZE_LIMITS`).
MAX_SIZE = 2**26
#: The largest product of one operator's channel sizes (the widest row any of its tensors can
#: have): with at most 26 operators a layer, inputs at most 2**16 wide and 8-byte elements,
#: every fused projection's byte count stays below 2**63.
MAX_WIDTH = 2**36

_BINARY: dict[type, Callable[[float, float], float]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Pow: operator.pow,
}


def shown(text: str) -> str:
    """``text`` quoted for a one-line message, cut to its start when it is long."""
    if len(text) <= 60:
        return repr(text)
    return f"{text[:40]!r}... ({len(text)} characters)"


def _limit(value: int) -> str:
    """``9007199254740992 (2**53)``: a power-of-two limit as a number and as a power."""
    if value > 1 and value & (value - 1) == 0:
        return f"{value} (2**{value.bit_length() - 1})"
    return str(value)


def _is_real(value: object) -> bool:
    """A finite int or float (not a bool, not complex) within `MAX_MAGNITUDE`."""
    # abs() first: it never overflows, and NaN and infinity compare False
    return (isinstance(value, (int, float)) and not isinstance(value, bool)
            and abs(value) <= MAX_MAGNITUDE)


def _depth(tree: ast.AST) -> int:
    """The nesting depth of a tree, without recursion (the tree is bounded, but cheaply so)."""
    deepest, stack = 0, [(tree, 1)]
    while stack:
        node, level = stack.pop()
        deepest = max(deepest, level)
        stack.extend((child, level + 1) for child in ast.iter_child_nodes(node)
                     if isinstance(child, ast.expr))
    return deepest


@functools.lru_cache(maxsize=512)
def _parse(text: str) -> ast.expr:
    """The checked tree of an expression of at most `MAX_CHARS` characters. Cached: the keys
    are short strings and a failure (an exception) is never stored."""
    try:
        tree = ast.parse(text.strip(), mode="eval").body
    except SyntaxError as exc:
        raise FolnetError(f"cannot parse expression {shown(text)}: {exc.msg}") from None
    except (ValueError, RecursionError, MemoryError) as exc:  # NUL bytes, a too-deep parse
        raise FolnetError(f"cannot parse expression {shown(text)}: "
                          f"{type(exc).__name__}") from None
    nodes = sum(isinstance(node, ast.expr) for node in ast.walk(tree))
    if nodes > MAX_NODES:
        raise FolnetError(f"expression {shown(text)} has {nodes} terms, more than the limit "
                          f"{MAX_NODES}")
    depth = _depth(tree)
    if depth > MAX_DEPTH:
        raise FolnetError(f"expression {shown(text)} is nested {depth} deep, more than the "
                          f"limit {MAX_DEPTH}")
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            if node.id not in DIM_NAMES:
                raise FolnetError(f"unknown name {node.id!r} in expression {shown(text)}; use "
                                  f"{choices(DIM_NAMES)}")
        elif isinstance(node, ast.Constant):
            if not isinstance(node.value, (int, float)) or isinstance(node.value, bool):
                raise FolnetError(f"only numbers are allowed in expression {shown(text)}")
            if not _is_real(node.value):
                raise FolnetError(f"the number {node.value!r} in expression {shown(text)} "
                                  f"exceeds the magnitude limit {_limit(MAX_MAGNITUDE)}")
        elif isinstance(node, ast.BinOp):
            if type(node.op) not in _BINARY:
                raise FolnetError(f"operator {type(node.op).__name__} not allowed in "
                                  f"{shown(text)}")
        elif isinstance(node, ast.UnaryOp):
            if not isinstance(node.op, (ast.USub, ast.UAdd)):
                raise FolnetError(f"operator {type(node.op).__name__} not allowed in "
                                  f"{shown(text)}")
        elif not isinstance(node, (ast.operator, ast.unaryop, ast.Load, ast.expr_context)):
            raise FolnetError(f"{type(node).__name__} not allowed in expression {shown(text)}")
    return tree


def _tree(text: object) -> ast.expr:
    """`_parse` behind the checks that must come before any parsing: the type and length."""
    if not isinstance(text, str):
        raise FolnetError(f"expected an expression string, got {type(text).__name__}")
    if len(text) > MAX_CHARS:
        raise FolnetError(f"expression {shown(text)} is longer than the limit of {MAX_CHARS} "
                          f"characters")
    return _parse(text)


def _power(base: float, exponent: float) -> str | None:
    """Why ``base ** exponent`` must not be computed, or None when it may: judged before the
    power is taken, so ``9**9**9`` costs nothing."""
    if exponent > MAX_EXPONENT:
        return f"exponent {exponent!r} exceeds the limit {MAX_EXPONENT}"
    if exponent < -MAX_EXPONENT:
        return f"exponent {exponent!r} is below the limit {-MAX_EXPONENT}"
    if base == 0:
        return "division by zero (0 to a negative power)" if exponent < 0 else None
    power = f"{f'({base!r})' if base < 0 else repr(base)}**{exponent!r}"
    if base < 0 and exponent != int(exponent):
        return f"{power} is not a real number (a negative base to a fractional power)"
    if exponent * math.log2(abs(base)) > math.log2(MAX_MAGNITUDE) + 1e-9:
        return f"{power} exceeds the magnitude limit {_limit(MAX_MAGNITUDE)}"
    return None


def _evaluate(text: str, tree: ast.expr, dims: Mapping[str, int | float]) -> float:
    """The value of a checked tree; a fault raises `FolnetError` with the bare reason (the
    caller says whose expression it is)."""

    def walk(node: ast.expr) -> float:
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, ast.Name):
            if node.id not in dims:
                raise FolnetError(f"needs {node.id}, which is not set")
            value = dims[node.id]
            if not _is_real(value):
                raise FolnetError(f"{node.id} = {value!r} is not a finite number within the "
                                  f"magnitude limit {_limit(MAX_MAGNITUDE)}")
            return value
        if isinstance(node, ast.UnaryOp):
            value = walk(node.operand)
            return -value if isinstance(node.op, ast.USub) else value
        if isinstance(node, ast.BinOp):
            left, right = walk(node.left), walk(node.right)
            kind = type(node.op)
            if kind in (ast.Div, ast.FloorDiv) and right == 0:
                raise FolnetError("division by zero")
            if kind is ast.Pow:
                refusal = _power(left, right)
                if refusal is not None:
                    raise FolnetError(refusal)
            try:
                value = _BINARY[kind](left, right)
            except (ArithmeticError, ValueError) as exc:  # bounded above; kept as a net
                raise FolnetError(f"{type(exc).__name__}: {exc}") from None
            if isinstance(value, complex):
                raise FolnetError(f"{value!r} is not a real number")
            if not math.isfinite(value):
                raise FolnetError(f"an intermediate result is {value!r}, not a finite number")
            if abs(value) > MAX_MAGNITUDE:
                raise FolnetError(f"the intermediate result {value!r} exceeds the magnitude "
                                  f"limit {_limit(MAX_MAGNITUDE)}")
            return value
        raise FolnetError(f"cannot evaluate {type(node).__name__}")  # unreachable: _parse

    return walk(tree)


def check_expression(text: str) -> None:
    """Raise `FolnetError` unless ``text`` is a valid size/scale expression. One that names no
    dimension is evaluated too (bounded), so a constant like ``9**9**9`` is refused when its
    spec is read, not when a model is built."""
    tree = _tree(text)
    if not any(isinstance(node, ast.Name) for node in ast.walk(tree)):
        try:
            _evaluate(text, tree, {})
        except FolnetError as exc:
            raise FolnetError(f"expression {shown(text)}: {exc}") from None


def evaluate(text: str, dims: Mapping[str, int | float], *, what: str = "expression") -> float:
    """Evaluate an expression with the model dimensions ``dims`` (missing names are an error).
    Every fault is one `FolnetError` line, ``WHAT = 'TEXT': reason``."""
    try:
        tree = _tree(text)
    except FolnetError as exc:
        raise FolnetError(f"{what}: {exc}") from None
    try:
        return _evaluate(text, tree, dims)
    except FolnetError as exc:
        raise FolnetError(f"{what} = {shown(text)}: {exc}") from None


def evaluate_int(text: str, dims: Mapping[str, int | float], *, what: str) -> int:
    """Evaluate a width: it must come out an integer in [1, `MAX_SIZE`]."""
    value = evaluate(text, dims, what=what)
    if value != int(value) or not 1 <= value <= MAX_SIZE:
        raise FolnetError(f"{what} = {shown(text)} evaluates to {value!r}, expected an integer "
                          f"in [1, {_limit(MAX_SIZE)}]")
    return int(value)


def evaluate_scale(text: str, dims: Mapping[str, int | float], *, what: str) -> float:
    """Evaluate a projection's constant scale: a positive number in [`MIN_SCALE`,
    `MAX_MAGNITUDE`] (zero would silence the operator, a negative one flip it; neither is a
    scale)."""
    value = evaluate(text, dims, what=what)
    if not MIN_SCALE <= value <= MAX_MAGNITUDE:
        raise FolnetError(f"{what} = {shown(text)} evaluates to {value!r}, expected a number "
                          f"in [2**-53, 2**53]")
    return float(value)


def channel_sizes(spec_sizes: tuple[tuple[str, str], ...], dims: Mapping[str, int | float],
                  *, symbol: str = "?", label: str | None = None) -> dict[str, int]:
    """The width of every channel letter of an operator (its spec's ``sizes``) for a model's
    dimensions, e.g. ``{"h": 12, "s": 64}``; each in [1, `MAX_SIZE`], their product at most
    `MAX_WIDTH`. ``label`` (default ``operator 'SYMBOL'``) starts every error message."""
    label = label or f"operator {symbol!r}"
    sizes = {c: evaluate_int(e, dims, what=f"{label}: field 'sizes': {c}")
             for c, e in spec_sizes}
    width = math.prod(sizes.values())
    if width > MAX_WIDTH:
        raise FolnetError(f"{label}: field 'sizes': the channel sizes {sizes} multiply to "
                          f"{width}, more than the limit {_limit(MAX_WIDTH)}")
    return sizes
