"""The operator registry: built-ins loaded from folnet/specs/operators.toml, custom ones registered.

Look-ups accept a symbol (``"j"``) or a name (``"join"``); a miss lists what exists. Registering
refuses a duplicate symbol or name unless ``replace=True``. A registered operator is usable
everywhere a built-in is: compiled kernels, architecture strings, checkpoints.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping
from pathlib import Path

from folnet import read_files
from folnet.errors import FolnetError, choices
from folnet.ops.spec import OperatorSpec, parse_spec

_LOCK = threading.RLock()
_SPECS: dict[str, OperatorSpec] = {}
_BUILTINS: frozenset[str] = frozenset()


def parse_spec_file(text: str, *, source: str = "<string>") -> list[OperatorSpec]:
    """Parse a TOML document of ``[[operator]]`` tables (or one bare table) into specs.
    ``[[operators]]``, as an ablation plan names them, is taken too."""
    data = read_files.loads(text, source=source)
    named = [key for key in ("operator", "operators") if key in data]
    if len(named) == 2:
        raise FolnetError(f"{source}: both [[operator]] and [[operators]] tables; list every "
                          f"operator under one of them")
    if named:
        tables = data[named[0]]
        if isinstance(tables, Mapping):
            tables = [tables]
        extra = sorted(set(data) - {named[0]})
        if extra:
            raise FolnetError(f"{source}: unknown top-level key(s) {extra}; expected [[operator]]")
    else:
        tables = [data]
    specs = [parse_spec(t) for t in tables]
    _check_unique(specs, source=source)
    return specs


def _check_unique(specs: list[OperatorSpec], *, source: str) -> None:
    seen_sym: dict[str, str] = {}
    seen_name: dict[str, str] = {}
    for spec in specs:
        if spec.symbol in seen_sym:
            raise FolnetError(f"{source}: operator {spec.symbol!r} ({spec.name}): field 'symbol': "
                              f"duplicate of {spec.symbol!r} ({seen_sym[spec.symbol]})")
        if spec.name in seen_name:
            raise FolnetError(f"{source}: operator {spec.symbol!r} ({spec.name}): field 'name': "
                              f"duplicate of operator {seen_name[spec.name]!r}")
        seen_sym[spec.symbol] = spec.name
        seen_name[spec.name] = spec.symbol


def _ensure_loaded() -> None:
    global _BUILTINS
    if _SPECS:
        return
    with _LOCK:
        if _SPECS:
            return
        path = read_files.specs_dir() / "operators.toml"
        if not path.is_file():
            raise FolnetError(f"built-in operator specs not found at {str(path)!r}")
        specs = parse_spec_file(path.read_text(encoding="utf-8"), source=str(path))
        for spec in specs:
            _SPECS[spec.symbol] = spec
        _BUILTINS = frozenset(_SPECS)


def operators() -> tuple[OperatorSpec, ...]:
    """Every registered operator, built-ins first, in registration order."""
    _ensure_loaded()
    return tuple(_SPECS.values())


def get_operator(key: str | OperatorSpec) -> OperatorSpec:
    """The frozen spec of an operator by symbol (``"j"``) or name (``"join"``)."""
    if isinstance(key, OperatorSpec):
        return key
    _ensure_loaded()
    spec = _SPECS.get(key)
    if spec is None:
        spec = next((s for s in _SPECS.values() if s.name == key), None)
    if spec is None:
        known = [f"{s.symbol} ({s.name})" for s in _SPECS.values()]
        raise FolnetError(f"unknown operator {key!r}; registered operators: {', '.join(known)}")
    return spec


def is_builtin(symbol: str) -> bool:
    _ensure_loaded()
    return symbol in _BUILTINS


def register_operator(
    table: str | Mapping[str, object] | OperatorSpec | None = None,
    /,
    *,
    replace: bool = False,
    **fields: object,
) -> OperatorSpec:
    """Register a custom operator and return its validated spec.

    Pass the spec's fields as keyword arguments, or one TOML table (a string, optionally as a
    single ``[[operator]]`` or ``[operator]`` table) or mapping. Built-ins cannot be replaced;
    a custom operator can be, with ``replace=True``.
    """
    if table is not None and fields:
        raise FolnetError("register_operator: pass either a TOML table or keyword fields, not both")
    if isinstance(table, OperatorSpec):
        spec = table
    elif isinstance(table, str):
        specs = parse_spec_file(table, source="register_operator")
        if len(specs) != 1:
            raise FolnetError(f"register_operator: expected one operator table, got {len(specs)}")
        spec = specs[0]
    elif isinstance(table, Mapping):
        spec = parse_spec(table)
    elif table is None:
        spec = parse_spec(fields)
    else:
        raise FolnetError(f"register_operator: expected a TOML string, a mapping or keyword "
                          f"fields, got {type(table).__name__}")
    _ensure_loaded()
    with _LOCK:
        clash = [s for s in _SPECS.values()
                 if (s.symbol == spec.symbol or s.name == spec.name) and s != spec]
        for old in clash:
            if old.symbol in _BUILTINS:
                raise FolnetError(
                    f"operator {spec.symbol!r} ({spec.name}): clashes with built-in operator "
                    f"{old.symbol!r} ({old.name}); built-ins cannot be replaced, pick another "
                    f"symbol than {choices(sorted(_SPECS))}")
            if not replace:
                raise FolnetError(
                    f"operator {spec.symbol!r} ({spec.name}): clashes with registered operator "
                    f"{old.symbol!r} ({old.name}); pass replace=True to replace it")
        for old in clash:
            del _SPECS[old.symbol]
        _SPECS[spec.symbol] = spec
    return spec


def unregister_operator(symbol: str) -> None:
    """Remove a custom operator (built-ins stay)."""
    _ensure_loaded()
    with _LOCK:
        if symbol in _BUILTINS:
            raise FolnetError(f"operator {symbol!r} is a built-in and cannot be unregistered")
        if symbol not in _SPECS:
            raise FolnetError(f"operator {symbol!r} is not registered")
        del _SPECS[symbol]


def ensure_registered(specs: list[OperatorSpec] | tuple[OperatorSpec, ...], *,
                      source: str) -> None:
    """Register each of ``specs``, or check that the operator registered under its symbol is
    the same one: what a run, a plan or a checkpoint declares is used as declared, and one that
    differs from what this process already has is refused, naming ``source`` -- never a
    silently different operator."""
    for spec in specs:
        try:
            existing = get_operator(spec.symbol)
        except FolnetError:
            register_operator(spec)
            continue
        if existing != spec:
            where = "a built-in" if is_builtin(spec.symbol) else "the registered one"
            raise FolnetError(f"{source}: operator {spec.symbol!r} ({spec.name}) differs from "
                              f"{where} {existing.symbol!r} ({existing.name}); pick another "
                              f"symbol (or unregister the other first)")


def read_operator_file(path: str | os.PathLike[str], *, what: str) -> list[OperatorSpec]:
    """The operators of a TOML file of ``[[operator]]`` tables (the format of
    folnet/specs/operators.toml), validated as `register_operator` validates; a missing or
    invalid file is a `FolnetError` naming ``what`` (the flag or key) and the file."""
    file = Path(path)
    if not file.is_file():
        raise FolnetError(f"{what} {str(path)!r} does not exist (a TOML file of [[operator]] "
                          f"tables)")
    try:
        text = file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise FolnetError(f"{what} {str(path)!r} cannot be read: {exc}") from None
    specs = parse_spec_file(text, source=f"{what} {str(path)!r}")
    builtin = [s.symbol for s in specs if is_builtin(s.symbol)]
    if builtin:
        raise FolnetError(f"{what} {str(path)!r} declares {builtin}, which are built-ins; give "
                          f"the new operators other symbols")
    return specs
