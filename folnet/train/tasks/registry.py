"""The task registry: every finetuning task, and the family that reads, encodes and scores it.

A `TaskFamily` is what a kind of data needs from the finetuning code: a reader for its splits,
an encoder into model inputs, a scorer (metrics and prediction rows from the model's outputs)
and optionally an official prediction file. Each family module declares one and
`folnet.train.tasks` registers them in a fixed order, so every task -- the generated kinship
task included -- is found, read and scored the same way, and nothing branches on task names.

``options`` (a mapping) is how a run's settings reach a family: a family reads the keys it
knows (``max_len``, ``doc_stride``, ``n_best``, ``kinship_train_k``, ...) and ignores the rest,
so the tasks layer does not depend on the finetuning configuration.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from tokenizers import Tokenizer

from folnet.errors import FolnetError, choices
from folnet.train.tasks.base import EncodedSplit, SplitData, TaskSpec
from folnet.train.tasks.hfdatasets import Published, RowSource, locate_split, read_rows

__all__ = ["TASKS", "TaskFamily", "family_of", "get_task", "read_files", "read_split",
           "register_family"]

Options = Mapping[str, Any]
Reader = Callable[[TaskSpec, "str | Path | None", Sequence[str], Options], dict[str, SplitData]]
Encoder = Callable[[TaskSpec, SplitData, Tokenizer, Options], EncodedSplit]
Rows = list[dict[str, Any]]
Scorer = Callable[[TaskSpec, EncodedSplit, Mapping[str, torch.Tensor], Options],
                  tuple[dict[str, float], Rows]]


@dataclass(frozen=True)
class TaskFamily:
    """How one family of tasks is read, encoded and scored.

    ``read(spec, data_dir, splits, options)`` returns a `SplitData` per split name;
    ``encode(spec, split, tokenizer, options)`` an `EncodedSplit`; ``score(spec, split,
    outputs, options)`` the split's metrics (empty when unlabelled) and one prediction row per
    item (``id``, ``prediction``, ``label`` and the split's columns). ``official(rows)`` is the
    payload of an official ``<split>.json`` prediction file, for families that have one.
    ``generated`` families make their data and read no ``data_dir``.
    """

    name: str
    tasks: tuple[TaskSpec, ...]
    read: Reader
    encode: Encoder
    score: Scorer
    official: Callable[[Rows], Any] | None = None
    generated: bool = False


#: Every registered task by name, in registration order.
TASKS: dict[str, TaskSpec] = {}
_FAMILIES: dict[str, TaskFamily] = {}


def register_family(family: TaskFamily) -> None:
    """Make the family's tasks known to `get_task`, ``folnet finetune`` and ``folnet ablate``."""
    if family.name in _FAMILIES:
        raise FolnetError(f"task family {family.name!r} is already registered")
    for spec in family.tasks:
        if spec.family != family.name:
            raise FolnetError(f"task {spec.name!r} belongs to family {spec.family!r}, not "
                              f"{family.name!r}")
        if spec.name in TASKS:
            raise FolnetError(f"task {spec.name!r} is already registered")
    _FAMILIES[family.name] = family
    TASKS.update((spec.name, spec) for spec in family.tasks)


def get_task(name: str | TaskSpec) -> TaskSpec:
    """The registered task called ``name`` (a `TaskSpec` is passed through unchanged)."""
    if isinstance(name, TaskSpec):
        return name
    try:
        return TASKS[name]
    except KeyError:
        raise FolnetError(f"unknown task {name!r}: expected {choices(TASKS)}") from None


def family_of(task: str | TaskSpec) -> TaskFamily:
    """The family that reads, encodes and scores ``task``."""
    spec = get_task(task)
    try:
        return _FAMILIES[spec.family]
    except KeyError:
        raise FolnetError(f"task {spec.name!r}: no task family {spec.family!r} is registered "
                          f"(registered: {choices(_FAMILIES)})") from None


def read_split(task: TaskSpec | str, data_dir: str | Path | None, split: str,
               options: Options | None = None) -> SplitData:
    """Read ``split`` of ``task`` (from the published files under ``data_dir``, or from the
    generator of a generated task)."""
    spec = get_task(task)
    return family_of(spec).read(spec, data_dir, (split,), options or {})[split]


def read_files(parse: Callable[[TaskSpec, list[Path], str], Sequence[Any]], *,
               published: Mapping[str, Published] | None = None,
               labels_from: Callable[[Sequence[Any]], tuple[str, ...]] | None = None) -> Reader:
    """A family reader over a data directory.

    Each split is read from its original file(s) with ``parse(spec, paths, split)`` when they
    are there, else -- for a task listed in ``published`` -- from the split in a Hugging Face
    datasets format (`hfdatasets.locate_split`), whose checked rows the task's
    `Published.convert` turns into the same examples. A task whose label set is not fixed in
    advance (CLUTRR) gets it from ``labels_from(train examples)`` first; its other splits are
    then read against that set.
    """
    def read(spec: TaskSpec, data_dir: str | Path | None, splits: Sequence[str],
             options: Options) -> dict[str, SplitData]:
        if data_dir is None:
            raise FolnetError(f"{spec.name}: no data directory given")
        form = (published or {}).get(spec.name)
        located = {name: locate_split(spec, data_dir, name, form) for name in splits}

        def examples(task: TaskSpec, name: str,
                     where: list[Path] | RowSource) -> tuple[tuple[Path, ...], tuple[Any, ...]]:
            if isinstance(where, RowSource):
                assert form is not None  # locate_split finds rows only for a published task
                return where.paths, tuple(form.convert(task, read_rows(where, form, name)))
            return tuple(where), tuple(parse(task, where, name))

        done = {}
        if spec.labels is None and labels_from is not None:
            train = located.get("train") or locate_split(spec, data_dir, "train", form)
            done["train"] = examples(spec, "train", train)
            spec = dataclasses.replace(spec, labels=labels_from(done["train"][1]))
        out = {}
        for name, where in located.items():
            paths, items = done.get(name) or examples(spec, name, where)
            out[name] = SplitData(spec, name, paths, items)
        return out

    return read
