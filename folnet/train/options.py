"""Run options as frozen dataclasses: one field per command-line flag, checked, layered from TOML.

`folnet pretrain` and `folnet finetune` describe every option once, as a field of a frozen
dataclass built with `option` (default, help text, and optionally the flag's spelling or a
parser). This module turns such a class into the rest of what a command needs, so the command
line, the TOML files under ``folnet/specs/train/`` and the Python API cannot drift apart:

* `Options`, the base class: ``replace``, ``to_dict``, ``from_dict`` (unknown keys named with
  their source), type checks against the annotations (ints widen to floats) and the range and
  choice checks, each failure a `FolnetError` naming the flag a user would type;
* `load_layered`: defaults file, then ``--config FILE``, then flags, each layer checked as it
  is added so that an unknown key names the file it came from;
* `add_flags` and `given_flags`: the argparse side (only flags the user gives override).
"""

from __future__ import annotations

import argparse
import dataclasses
import operator
import os
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from folnet import read_files
from folnet.errors import FolnetError, choices

__all__ = ["Options", "add_flags", "check_count", "format_default", "given_flags",
           "load_layered", "option", "read_toml", "specs_file"]

ConfigT = TypeVar("ConfigT", bound="Options")

_TYPES: dict[str, tuple[type, ...]] = {"str": (str,), "int": (int,), "float": (float, int),
                                       "bool": (bool,)}
_KINDS = {"str": "a string", "int": "an integer", "float": "a number", "bool": "true or false"}
_METAVARS = {"str": "TEXT", "int": "N", "float": "X"}


def specs_file(*parts: str) -> Path:
    """A file of the bundled ``folnet/specs/`` directory (``$FOLNET_SPECS`` points elsewhere)."""
    return read_files.specs_dir().joinpath(*parts)


def read_toml(path: str | os.PathLike[str]) -> dict[str, Any]:
    """A TOML file as a dict; a missing or invalid file is a `FolnetError` naming it."""
    return read_files.load(path)


def option(default: Any, help_text: str, *, flag: str | None = None,
           parse: Callable[[str, Any], Any] | None = None, metavar: str | None = None) -> Any:
    """A dataclass field that is a command-line option.

    ``flag`` spells the flag when it is not the field name with dashes (``checkpoint`` is
    ``--from``); ``parse(flag, value)`` turns a field that is not a plain str/int/float/bool
    (a tuple) into its stored form, raising `FolnetError` on bad input.
    """
    metadata = {"help": help_text, "flag": flag, "parse": parse, "metavar": metavar}
    return dataclasses.field(default=default, metadata=metadata)


def _base_type(field: dataclasses.Field) -> tuple[str, bool]:
    """(annotation without ``| None``, whether None is allowed); annotations are strings."""
    text = str(field.type)
    return text.removesuffix(" | None"), text.endswith("| None")


class Options:
    """Base of the frozen option dataclasses (see the module docstring)."""

    @classmethod
    def flag(cls, name: str) -> str:
        """The command-line flag of field ``name``."""
        spelled = cls.__dataclass_fields__[name].metadata.get("flag")  # type: ignore[attr-defined]
        return spelled or "--" + name.replace("_", "-")

    def replace(self: ConfigT, **changes: Any) -> ConfigT:
        return dataclasses.replace(self, **changes)  # type: ignore[type-var]

    def to_dict(self) -> dict[str, Any]:
        """The options as plain data (tuples become lists, as JSON would make them)."""
        data = {}
        for f in dataclasses.fields(self):  # type: ignore[arg-type]
            value = getattr(self, f.name)
            data[f.name] = list(value) if isinstance(value, tuple) else value
        return data

    @classmethod
    def from_dict(cls: type[ConfigT], data: Mapping[str, Any], *,
                  source: str = "config") -> ConfigT:
        """``cls(**data)``; keys that are no option are named with their ``source``."""
        known = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
        unknown = sorted(set(data) - known)
        if unknown:
            raise FolnetError(f"{source}: unknown option(s) {unknown}; known: {sorted(known)}")
        return cls(**dict(data))

    # -- checks, for __post_init__ -------------------------------------------------------------
    def _set(self, name: str, value: Any) -> None:
        object.__setattr__(self, name, value)  # the dataclasses are frozen

    def check_types(self) -> None:
        """Every field against its annotation; parse tuple fields, widen ints to floats."""
        for f in dataclasses.fields(self):  # type: ignore[arg-type]
            value = getattr(self, f.name)
            parse = f.metadata.get("parse")
            if parse is not None:
                self._set(f.name, parse(self.flag(f.name), value))
                continue
            base, optional = _base_type(f)
            if value is None:
                if optional:
                    continue
                raise FolnetError(f"{self.flag(f.name)} must be set, got None")
            allowed = _TYPES.get(base)
            if allowed is None:  # pragma: no cover - a field added without a type rule
                continue
            if not isinstance(value, allowed) or (isinstance(value, bool) and base != "bool"):
                raise FolnetError(f"{self.flag(f.name)} must be {_KINDS[base]}, got {value!r}")
            if base == "float":
                self._set(f.name, float(value))

    def check_at_least(self, bounds: Iterable[tuple[str, int]]) -> None:
        """Each named option (when set) is at least its bound."""
        for name, low in bounds:
            value = getattr(self, name)
            if value is not None and value < low:
                raise FolnetError(f"{self.flag(name)} must be >= {low}, got {value}")

    def check_non_negative(self, names: Iterable[str]) -> None:
        """Each named option (when set) is >= 0; NaN is refused too."""
        for name in names:
            value = getattr(self, name)
            if value is not None and not value >= 0.0:
                raise FolnetError(f"{self.flag(name)} must be >= 0, got {value}")

    def check_within(self, intervals: Iterable[tuple[str, float, float, bool]]) -> None:
        """Each ``(name, lo, hi, open_hi)``: the option (when set) lies in [lo, hi] or
        [lo, hi) when ``open_hi``."""
        for name, lo, hi, open_hi in intervals:
            value = getattr(self, name)
            if value is not None and not (lo <= value < hi if open_hi else lo <= value <= hi):
                raise FolnetError(f"{self.flag(name)} must lie in [{lo}, {hi}"
                                  f"{')' if open_hi else ']'}, got {value}")

    def check_choices(self, sets: Iterable[tuple[str, Iterable[str]]]) -> None:
        """Each named option is one of its closed set of values."""
        for name, allowed in sets:
            allowed = tuple(allowed)
            if getattr(self, name) not in allowed:
                raise FolnetError(f"{self.flag(name)} {getattr(self, name)!r} is unknown; use "
                                  f"{choices(allowed)}")


def load_layered(cls: type[ConfigT], defaults: Path, path: str | os.PathLike[str] | None = None,
                 overrides: Mapping[str, Any] | None = None, *,
                 tables: tuple[str, ...] = (),
                 recorded: tuple[str, Mapping[str, Any]] | None = None) -> ConfigT:
    """The defaults file, then a run's ``recorded`` options (its run_config.json, named, for a
    resume that need not retype them), then ``path`` (``--config``), then ``overrides`` (the
    flags given).

    Options are flat keys; the fields named in ``tables`` are TOML tables (``[model]``) whose
    keys merge one by one across layers. Each layer is checked as it is added, so an unknown
    key names the file it came from -- but for the recorded options, where a key another
    folnet version wrote and this one does not have is left out (it cannot be honoured either
    way).
    """
    layers: list[tuple[str, Mapping[str, Any]]] = [(str(defaults), read_toml(defaults))]
    if recorded is not None:
        known = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
        layers.append((recorded[0], {k: v for k, v in recorded[1].items() if k in known}))
    if path is not None:
        path = read_files.bundled_or_path(path, "train", what="--config")
        layers.append((str(path), read_toml(path)))
    if overrides:
        layers.append(("command line", dict(overrides)))
    merged: dict[str, Any] = {}
    for source, layer in layers:
        for key, value in layer.items():
            if key in tables:
                if not isinstance(value, Mapping):
                    raise FolnetError(f"{source}: {key!r} must be a table")
                merged[key] = {**dict(merged.get(key, {})), **dict(value)}
            elif isinstance(value, Mapping):
                allowed = " and ".join(f"[{t}]" for t in tables) or "none"
                raise FolnetError(f"{source}: unknown table [{key}]; options are flat keys "
                                  f"(tables allowed: {allowed})")
            else:
                merged[key] = value
        cls.from_dict(merged, source=source)
    return cls.from_dict(merged)


# -- the command line -------------------------------------------------------------------------


def format_default(value: Any) -> str:
    """A default as a user would type it: booleans as on/off (the flag and its --no- form),
    sequences comma-separated as the flag takes them."""
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, (list, tuple)):
        return ",".join(format_default(v) for v in value)
    return str(value)


def add_flags(parser: argparse.ArgumentParser, cls: type[Options],
              special: Mapping[str, Callable[[argparse.ArgumentParser, str], None]] | None = None,
              *, defaults: Mapping[str, Any] | None = None) -> None:
    """One flag per field of ``cls``, default None so that only flags the user gives override
    the files; ``special[name](parser, help)`` adds a field's flag itself.

    ``defaults`` (the defaults file the run starts from) supplies the "(default: X)" of each
    help text: the help then shows what a run would use, not a copy that could drift from it.
    """
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        text = f.metadata.get("help", "")
        if defaults is not None and f.name in defaults and not isinstance(defaults[f.name],
                                                                           Mapping):
            shown = format_default(defaults[f.name]).replace("%", "%%")  # argparse formats help
            text = f"{text} (default: {shown})"
        kind, _optional = _base_type(f)
        flag = cls.flag(f.name)
        if special and f.name in special:
            special[f.name](parser, text)
        elif kind == "bool":
            parser.add_argument(flag, dest=f.name, action=argparse.BooleanOptionalAction,
                                default=None, help=text)
        else:
            parser.add_argument(flag, dest=f.name, default=None, help=text,
                                type=None if kind.startswith("tuple") else _scalar(kind),
                                metavar=f.metadata.get("metavar") or _METAVARS.get(kind))


def _scalar(kind: str) -> Callable[[str], Any]:
    return {"str": str, "int": int, "float": float}[kind]


def given_flags(args: argparse.Namespace, cls: type[Options]) -> dict[str, Any]:
    """The fields of ``cls`` that the command line set."""
    return {f.name: getattr(args, f.name) for f in dataclasses.fields(cls)  # type: ignore[arg-type]
            if getattr(args, f.name, None) is not None}


# -- plain arguments --------------------------------------------------------------------------


def check_count(name: str, value: object, low: int, high: int | None = None) -> int:
    """An integer argument, checked: a bool, a float or a value outside [low, high] is a
    `FolnetError` naming the argument, its value and the limit."""
    try:
        number = operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        number = None
    if number is None or isinstance(value, bool):
        raise FolnetError(f"{name} must be an integer, got {value!r}")
    if number < low:
        raise FolnetError(f"{name} must be at least {low}, got {number}")
    if high is not None and number > high:
        raise FolnetError(f"{name} must be at most {high}, got {number}")
    return number
