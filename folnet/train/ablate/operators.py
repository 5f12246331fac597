"""The custom operators of an ablation plan, each with where it was declared: the plan's own
``[[operators]]`` tables, the command line's ``--operators FILE``, or the ``OUT/plan.json`` of
an earlier run into the same ``--out``.

Why the source is kept: the report says where each operator comes from, and a rerun or resume
into an existing OUT needs no ``--operators`` again -- the run's plan.json holds the specs
(and their sources), registered here before the plan's rows are read. A spec given again that
differs from the recorded one is refused, naming the fields that differ: the run's finished
rows were trained with the recorded one.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from folnet.errors import FolnetError
from folnet.ops.registry import ensure_registered, is_builtin
from folnet.ops.spec import parse_spec, spec_to_dict
from folnet.read_files import read_json

__all__ = ["PLAN_SOURCE", "Declared", "file_source", "plan_operators", "recorded_operators",
           "with_record"]

#: Where an operator of the plan's own ``[[operators]]`` tables is declared.
PLAN_SOURCE = "the plan ([[operators]])"


def file_source(path: str | Path) -> str:
    """Where an operator of ``--operators FILE`` is declared, as the report says it."""
    return f"the --operators file `{path}`"


@dataclass(frozen=True)
class Declared:
    """An operator spec (`folnet.ops.spec.spec_to_dict`'s form) and where it was declared."""

    spec: Mapping[str, Any]
    source: str

    @property
    def symbol(self) -> str:
        return str(self.spec.get("symbol"))


def _normal(spec: Mapping[str, Any], where: str) -> dict[str, Any]:
    try:
        return spec_to_dict(parse_spec(dict(spec)))
    except FolnetError as exc:
        raise FolnetError(f"{where}: {exc}") from None


def _differences(mine: Mapping[str, Any], theirs: Mapping[str, Any]) -> str:
    keys = sorted(k for k in {*mine, *theirs} if mine.get(k) != theirs.get(k))
    return ", ".join(f"{k} {mine.get(k)!r} vs {theirs.get(k)!r}" for k in keys)


def plan_operators(raw: Any, sources: Any, extra: Sequence[Declared], name: str
                   ) -> tuple[tuple[dict[str, Any], ...], tuple[str, ...]]:
    """The plan's operators and their sources: its ``[[operators]]`` tables ``raw`` (declared
    by the plan, or by what ``sources`` -- plan.json's ``operator_sources`` -- records for
    them), then ``extra`` (the command line's and the recorded ones), each symbol once. They
    are validated as `folnet.register_operator` validates them and registered, so that the
    rows' operator strings can use them; one symbol declared twice with different specs is
    refused, naming both sources."""
    where = f"plan {name!r} [[operators]]"
    if not isinstance(raw, (list, tuple)) or not all(isinstance(t, Mapping) for t in raw):
        raise FolnetError(f"{where}: expected a list of operator tables ([[operators]]), got "
                          f"{raw!r}")
    if not isinstance(sources, Mapping):
        raise FolnetError(f"plan {name!r}: operator_sources must be a table of operator "
                          f"symbol -> where it was declared, got {sources!r}")
    declared = [Declared(_normal(t, where), str(sources.get(t.get("symbol"), PLAN_SOURCE)))
                for t in raw]
    declared += [Declared(_normal(d.spec, f"{where} ({d.source})"), d.source) for d in extra]
    merged: dict[str, Declared] = {}
    for item in declared:
        seen = merged.setdefault(item.symbol, item)
        if seen.spec != item.spec:
            raise FolnetError(f"{where}: operator {item.symbol!r} is declared by {seen.source} "
                              f"and, differently, by {item.source} "
                              f"({_differences(seen.spec, item.spec)}); declare it once")
    builtin = [s for s in merged if is_builtin(s)]
    if builtin:
        raise FolnetError(f"{where}: {builtin} are built-in symbols; give yours others")
    ensure_registered([parse_spec(dict(d.spec)) for d in merged.values()], source=where)
    return (tuple(dict(d.spec) for d in merged.values()),
            tuple(d.source for d in merged.values()))


def recorded_operators(out: str | Path) -> list[Declared]:
    """The operators ``OUT/plan.json`` records (none when there is no such file), with the
    sources it records for them (`plan_to_dict`'s ``operator_sources``)."""
    record = Path(out) / "plan.json"
    if not record.is_file():
        return []
    data = read_json(record, what="plan.json")
    specs = data.get("operators", []) if isinstance(data, Mapping) else None
    sources = data.get("operator_sources", {}) if isinstance(data, Mapping) else None
    if (not isinstance(specs, list) or not all(isinstance(s, Mapping) for s in specs)
            or not isinstance(sources, Mapping)):
        raise FolnetError(f"{record}: 'operators' must be a list of operator tables and "
                          f"'operator_sources' a table; the file is not an ablation's record")
    return [Declared(_normal(s, str(record)),
                     str(sources.get(s.get("symbol"), f"the run's record `{record}`")))
            for s in specs]


def with_record(declared: Sequence[Declared], out: str | Path) -> list[Declared]:
    """The command line's operators ``declared`` and, after them, the others that the run in
    ``out`` recorded: a rerun or resume into OUT needs no ``--operators``. A declared spec
    that differs from the recorded one of its symbol is refused."""
    recorded = {d.symbol: d for d in recorded_operators(out)}
    for item in declared:
        theirs = recorded.get(item.symbol)
        mine = _normal(item.spec, item.source)
        if theirs is not None and theirs.spec != mine:
            raise FolnetError(f"{item.source} declares operator {item.symbol!r} otherwise than "
                              f"the run in --out {str(out)!r} recorded it "
                              f"({_differences(mine, theirs.spec)}; the record: "
                              f"{Path(out) / 'plan.json'}): its rows were trained with the "
                              f"recorded spec; give that one, leave --operators out to use "
                              f"it, or choose another --out")
    given = {d.symbol for d in declared}
    return [*declared, *(d for s, d in recorded.items() if s not in given)]
