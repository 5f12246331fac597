"""What a finetuning task is and what flows through it: task specifications, examples, splits.

A `TaskSpec` is plain frozen data so that a training run can record exactly which task
definition it used; each family of tasks (glue.py, squad.py, folio.py, clutrr.py, kinship.py)
declares its specs and the functions that read, encode and score them (`registry.TaskFamily`).
A split travels as `SplitData` (examples as read) and then as `EncodedSplit` (model inputs).
Hyper-parameter defaults come from Table 7 of the FOLNet paper; every task shares the optimiser
settings (Adam eps 1e-6, betas (0.9, 0.999), weight decay 0.01, dropout 0.1, 6% linear warmup
then linear decay) and differs in epochs, peak learning rate and batch size.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from folnet.errors import FolnetError, choices

__all__ = ["KINDS", "EncodedSplit", "Example", "FinetuneDefaults", "SplitData", "TaskSpec",
           "find_split_files", "missing_split", "split_dirs", "split_file_candidates"]

KINDS = ("classification", "regression", "qa", "generation")


@dataclass(frozen=True)
class FinetuneDefaults:
    """Optimiser and schedule defaults for one task (FOLNet paper, Table 7)."""

    epochs: int
    lr: float
    batch_size: int
    warmup_ratio: float = 0.06
    adam_eps: float = 1e-6
    adam_betas: tuple[float, float] = (0.9, 0.999)
    weight_decay: float = 0.01
    dropout: float = 0.1
    schedule: str = "linear"


@dataclass(frozen=True)
class TaskSpec:
    """One finetuning task.

    ``splits`` maps a split name to the file names tried in order (glob patterns for CLUTRR,
    whose published files are named like ``1.2,1.3_train.csv``). ``labels`` is None for
    regression, for QA, and for CLUTRR until its label set is read from the train file (its
    reader returns the task with ``labels`` filled in). ``data_subdir`` is the directory name
    the task has inside the usual download layout (e.g. ``glue_data/RTE``); a reader looks in
    ``data_dir`` first and then in ``data_dir/data_subdir``. ``family`` names the
    `TaskFamily` that reads, encodes and scores the task (default: the name up to a "/").
    """

    name: str
    kind: str
    labels: tuple[str, ...] | None
    metrics: tuple[str, ...]
    main_metric: str
    splits: tuple[tuple[str, tuple[str, ...]], ...]
    eval_splits: tuple[str, ...]
    seq_len: int
    defaults: FinetuneDefaults
    doc_stride: int | None = None
    data_subdir: str | None = None
    family: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise FolnetError(f"task {self.name!r}: kind {self.kind!r} is not {choices(KINDS)}")
        if self.main_metric not in self.metrics:
            raise FolnetError(f"task {self.name!r}: main metric {self.main_metric!r} not listed")
        if self.kind == "regression" and self.labels is not None:
            raise FolnetError(f"task {self.name!r}: a regression task has no label list")
        if not self.family:
            object.__setattr__(self, "family", self.name.split("/")[0])

    @property
    def split_names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.splits)

    def split_files(self, split: str) -> tuple[str, ...]:
        """The candidate file names (or patterns) for ``split``."""
        for name, files in self.splits:
            if name == split:
                return files
        raise FolnetError(
            f"task {self.name!r} has no split {split!r}: expected {choices(self.split_names)}"
        )

    @property
    def num_labels(self) -> int:
        """Output width of the task head: 1 for regression, the label count otherwise."""
        if self.kind == "regression":
            return 1
        if self.labels is None:
            raise FolnetError(
                f"task {self.name!r} has no label set yet: read its train split with "
                "read_split, which returns the task with its labels"
            )
        return len(self.labels)

    def label_id(self, label: str, where: str) -> int:
        """Index of ``label``; ``where`` (file:line or guid) is quoted when it is unknown."""
        if self.labels is None:
            raise FolnetError(f"task {self.name!r} has no label set (needed at {where})")
        try:
            return self.labels.index(label)
        except ValueError:
            raise FolnetError(
                f"{where}: label {label!r} is not a {self.name} label: expected "
                f"{choices(self.labels)}"
            ) from None


@dataclass(frozen=True)
class Example:
    """One classification/regression item: a text (pair) and its label.

    ``label`` is the label name for classification, a float for regression and None for
    unlabelled (test) data; ``text_b`` is None for single-sentence tasks.
    """

    guid: str
    text_a: str
    text_b: str | None
    label: str | float | None


def _listing(directory: Path) -> str:
    if not directory.is_dir():
        return f"{str(directory)!r} is not a directory"
    names = sorted(p.name for p in directory.iterdir())
    shown = ", ".join(names[:20]) + (f", ... ({len(names)} in all)" if len(names) > 20 else "")
    return f"{str(directory)!r} holds: {shown or '(nothing)'}"


def split_dirs(task: TaskSpec, data_dir: str | Path) -> list[Path]:
    """The directories a split of ``task`` is looked for in: ``data_dir``, then
    ``data_dir/data_subdir`` (the usual download layout, e.g. ``glue_data/RTE``)."""
    data_dir = Path(data_dir)
    return [data_dir, data_dir / task.data_subdir] if task.data_subdir else [data_dir]


def split_file_candidates(task: TaskSpec, data_dir: str | Path, split: str) -> list[Path]:
    """The file(s) holding ``split`` in the task's own published format, or [] when there are
    none: the first candidate name that exists, in the `split_dirs`. Glob patterns may match
    several files (all are returned, sorted)."""
    candidates = task.split_files(split)
    for directory in split_dirs(task, data_dir):
        for pattern in candidates:
            if any(ch in pattern for ch in "*?["):
                found = sorted(p for p in directory.glob(pattern) if p.is_file())
                if found:
                    return found
            elif (directory / pattern).is_file():
                return [directory / pattern]
    return []


def missing_split(task: TaskSpec, data_dir: str | Path, split: str,
                  alternatives: str = "") -> FolnetError:
    """The error for a split that is not there: the file names expected, ``alternatives``
    (other forms the split may take) and what ``data_dir`` holds instead."""
    expected = " or ".join(repr(str(d / c)) for d in split_dirs(task, data_dir)
                           for c in task.split_files(split))
    also = f", {alternatives}" if alternatives else ""
    return FolnetError(f"{task.name} split {split!r}: expected the file {expected}{also}; "
                       f"{_listing(Path(data_dir))}")


def find_split_files(task: TaskSpec, data_dir: str | Path, split: str) -> list[Path]:
    """`split_file_candidates`, raising `missing_split` when there are none."""
    found = split_file_candidates(task, data_dir, split)
    if not found:
        raise missing_split(task, data_dir, split)
    return found


@dataclass(frozen=True)
class SplitData:
    """One split as read: the task (with any data-derived labels filled in), the files it came
    from (none for a generated task), its examples (`Example`s, or what the family's encoder
    takes, e.g. `SquadExample`s) and per-example ``columns`` that prediction files carry
    along (the kinship task's chain length ``k``)."""

    task: TaskSpec
    split: str
    paths: tuple[Path, ...]
    examples: tuple[Any, ...]
    columns: Mapping[str, tuple[Any, ...]] = field(default_factory=dict)

    @property
    def source(self) -> str:
        """Where the examples came from, for messages: the files, or "generated"."""
        return ", ".join(map(str, self.paths)) or "generated"

    def head(self, limit: int | None) -> SplitData:
        """The first ``limit`` examples (all when None), columns cut alike."""
        if limit is None:
            return self
        return SplitData(self.task, self.split, self.paths, self.examples[:limit],
                         {name: values[:limit] for name, values in self.columns.items()})


@dataclass
class EncodedSplit:
    """One split ready for the model.

    ``ids`` name the items a prediction file lists (example guids, or SQuAD question ids);
    ``labels`` are their gold labels as read (label names, scores, or None when the split is
    unlabelled); ``tensors`` are the model inputs, one row per item -- per window for SQuAD.
    ``columns`` go into the prediction rows beside id, prediction and label; ``context`` is
    what the family's scorer needs besides the outputs (SQuAD: the questions and the windows
    that map the outputs back to them).
    """

    name: str
    source: str
    ids: list[str]
    labels: list[Any]
    tensors: dict[str, torch.Tensor]
    columns: dict[str, list[Any]] = field(default_factory=dict)
    context: Any = None

    @property
    def labelled(self) -> bool:
        return any(label is not None for label in self.labels)

    def __len__(self) -> int:
        return len(self.ids)
