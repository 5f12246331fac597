"""What the command line changes in a plan without copying it: ``--set KEY=VALUE`` and
``--rows``.

``--set`` writes into the plan's own data before it is validated, so a setting is checked as
the same key in the file would be (`folnet.train.ablate.plan.parse_plan_dict`): a top-level key
(``seeds=1``, ``data=kinship``), an option of a table (``pretrain.steps=20``,
``finetune.max_steps=50``, ``compare.scratch_steps=1``, ``cluster.time=30``). Values are read
as TOML values (``20``, ``1e-3``, ``true``, ``[2, 3]``, ``"text"``), and a bare word as a
string. The settings are recorded with the plan (its ``plan.json``) and named in its report,
but for the ``cluster`` ones: resources, not the plan (`folnet.train.ablate.cluster`).

``--rows`` picks rows by name, by directory name or by operator string (every row of that
string), checked before anything is written.
"""

from __future__ import annotations

import copy
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from folnet.errors import FolnetError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

__all__ = ["TABLES", "apply_settings", "parse_setting", "select_rows"]

#: The plan's tables whose options ``--set TABLE.OPTION=VALUE`` reaches.
TABLES = ("pretrain", "finetune", "compare", "cluster")
#: Top-level keys ``--set`` may not change: the plan's identity and its structure.
FIXED = ("name", "rows", "operators", "operator_sources", "set")


def parse_setting(text: str) -> tuple[tuple[str, ...], Any]:
    """``KEY=VALUE`` -> (key path, value); a malformed one is a `FolnetError` naming it."""
    key, sep, raw = text.partition("=")
    path = tuple(part.strip() for part in key.split("."))
    if not sep or not all(path) or len(path) > 2:
        raise FolnetError(f"--set {text!r}: expected KEY=VALUE or TABLE.OPTION=VALUE (e.g. "
                          f"seeds=1, pretrain.steps=20)")
    raw = raw.strip()
    try:
        value = tomllib.loads(f"value = {raw}")["value"]
    except tomllib.TOMLDecodeError:
        value = raw  # a bare word: a string
    return path, value


def apply_settings(data: Mapping[str, Any], settings: Sequence[str],
                   keys: Sequence[str]) -> dict[str, Any]:
    """A copy of the plan ``data`` with each ``--set`` applied in order; ``keys`` are the
    plan's top-level keys. An unknown key names what ``--set`` can reach."""
    out = copy.deepcopy(dict(data))
    for text in settings:
        path, value = parse_setting(text)
        top = path[0]
        if len(path) == 1:
            if top in FIXED or top in TABLES or top not in keys:
                settable = [k for k in keys if k not in FIXED and k not in TABLES]
                raise FolnetError(f"--set {text!r}: {top!r} is not a plan setting; use one of "
                                  f"{settable} or TABLE.OPTION with TABLE one of {list(TABLES)}")
            out[top] = value
            continue
        if top not in TABLES:
            raise FolnetError(f"--set {text!r}: {top!r} is not a table of the plan; use one of "
                              f"{list(TABLES)}")
        table = out.get(top, {})
        if not isinstance(table, Mapping):
            raise FolnetError(f"--set {text!r}: the plan's {top!r} is not a table")
        out[top] = {**dict(table), path[1]: value}
    return out


def select_rows(rows: Sequence[Any], only: Sequence[str] | None) -> list[Any]:
    """The rows ``only`` names -- a row's name, its directory name, or an operator string (all
    rows of that string) -- in the plan's order; a name that matches no row is a `FolnetError`
    listing the rows, raised before anything is written."""
    if not only:
        return list(rows)
    unknown = [w for w in only if not any(w in (r.name, r.slug, r.ops) for r in rows)]
    if unknown:
        listed = "; ".join(f"{r.name!r} (ops {r.ops})" for r in rows)
        raise FolnetError(f"--rows {unknown} names no row of the plan (a row name or operator "
                          f"string); rows: {listed}")
    return [r for r in rows if any(w in (r.name, r.slug, r.ops) for w in only)]
