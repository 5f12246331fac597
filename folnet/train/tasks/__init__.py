"""Finetuning tasks: registry, readers for the published file formats, and input encoding.

Typical use::

    data = read_split("glue/rte", "glue_data/RTE", "train")
    batch = encode_examples(data.task, data.examples, tokenizer)   # max_len = task.seq_len

`read_split` returns the task alongside the examples because one task (CLUTRR) only learns
its label set from its train file; always encode with ``data.task``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from folnet.train.tasks.base import (
    TASKS,
    Example,
    FinetuneDefaults,
    TaskSpec,
    find_split_files,
    get_task,
)
from folnet.train.tasks.clutrr import clutrr_labels, read_clutrr
from folnet.train.tasks.encode import (
    IGNORE_INDEX,
    SpecialIds,
    encode_examples,
    pack,
    special_ids,
    truncate_longest_first,
)
from folnet.train.tasks.folio import read_folio
from folnet.train.tasks.glue import read_glue
from folnet.train.tasks.squad import (
    SquadAnswer,
    SquadExample,
    SquadFeature,
    encode_squad,
    features_to_tensors,
    parse_squad,
    postprocess_predictions,
    read_squad,
)

__all__ = [
    "IGNORE_INDEX",
    "TASKS",
    "Example",
    "FinetuneDefaults",
    "SpecialIds",
    "SplitData",
    "SquadAnswer",
    "SquadExample",
    "SquadFeature",
    "TaskSpec",
    "clutrr_labels",
    "encode_examples",
    "encode_squad",
    "features_to_tensors",
    "find_split_files",
    "get_task",
    "pack",
    "parse_squad",
    "postprocess_predictions",
    "read_split",
    "special_ids",
    "truncate_longest_first",
]


@dataclass(frozen=True)
class SplitData:
    """One split as read: the task (with any data-derived labels filled in), the files it came
    from, and its examples (`Example`s, or `SquadExample`s for ``squad2``)."""

    task: TaskSpec
    split: str
    paths: tuple[Path, ...]
    examples: tuple[Example, ...] | tuple[SquadExample, ...]


def read_split(task: TaskSpec | str, data_dir: str | Path, split: str) -> SplitData:
    """Read ``split`` of ``task`` from the published files under ``data_dir``."""
    spec = get_task(task)
    paths = find_split_files(spec, data_dir, split)
    if spec.family == "glue":
        examples: list = read_glue(spec, paths[0], split)
    elif spec.family == "squad2":
        examples = read_squad(paths[0])
    elif spec.family == "folio":
        examples = read_folio(spec, paths[0], split)
    elif spec.family == "clutrr":
        if spec.labels is None:
            train_paths = paths if split == "train" else find_split_files(spec, data_dir, "train")
            spec = dataclasses.replace(spec, labels=clutrr_labels(train_paths))
        examples = read_clutrr(spec, paths, split)
    else:  # pragma: no cover - every registered family is handled above
        raise AssertionError(spec.family)
    return SplitData(spec, split, tuple(paths), tuple(examples))
