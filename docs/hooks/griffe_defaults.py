"""A griffe extension for the API pages (mkdocs.yml, mkdocstrings' ``extensions``): the
default of a dataclass field that a helper call declares is shown as its value.

The option dataclasses (``PretrainConfig``, ``FinetuneConfig``, ...) declare each field through
a call that also carries its help text and its parser -- ``option("jmc.atp", "...")``, or a
private helper such as ``_data_option("seq_len", "...")``. griffe reads the source, so the
class's signature printed those calls: the private helpers' names, the help texts, the parsers.
This reads the class itself instead and puts ``repr(default)`` in the call's place, before the
built-in dataclasses extension makes ``__init__`` from the fields. A field whose default is a
literal, or ``dataclasses.field(...)``, is left as the source says it.
tests/project/test_docs_site.py checks that no private name shows on the API pages.
"""

from __future__ import annotations

import dataclasses
import importlib
from typing import Any

import griffe

#: The package whose classes are read (the API pages document folnet only).
PACKAGE = "folnet"


def _runtime_class(cls: griffe.Class) -> Any:
    """The class object griffe's ``cls`` stands for, or None where it cannot be imported."""
    try:
        obj: Any = importlib.import_module(cls.module.path)
    except ImportError:
        return None
    for name in cls.path[len(cls.module.path) + 1:].split("."):
        obj = getattr(obj, name, None)
    return obj


def _declared_by_a_helper(value: object) -> bool:
    """A field value written as a call of something other than ``dataclasses.field``."""
    if not isinstance(value, griffe.ExprCall):
        return False
    return value.function.canonical_path not in ("dataclasses.field", "field")


def _show_values(cls: griffe.Class) -> None:
    runtime = _runtime_class(cls)
    if runtime is None or not dataclasses.is_dataclass(runtime):
        return
    for field in dataclasses.fields(runtime):
        member = cls.members.get(field.name)
        if member is None or member.is_alias or not _declared_by_a_helper(
                getattr(member, "value", None)):
            continue
        if field.default is not dataclasses.MISSING:
            default = field.default
        elif field.default_factory is not dataclasses.MISSING:
            default = field.default_factory()
        else:
            continue
        member.value = repr(default)


def _walk(obj: griffe.Module | griffe.Class) -> None:
    for member in list(obj.members.values()):
        if member.is_alias:
            continue
        if member.is_class:
            _show_values(member)
            _walk(member)
        elif member.is_module:
            _walk(member)


class ValuesForHelperDefaults(griffe.Extension):
    """Runs once the package is loaded (and before the dataclasses extension, which mkdocstrings
    adds after the configured ones)."""

    def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
        if pkg.name == PACKAGE:
            _walk(pkg)
