"""The data of a finetuning run: every split read, checked and encoded into tensors once.

Why encode up front: finetuning sets are small next to pretraining corpora, each run of a
multi-seed finetune reuses the same tensors, and a malformed file or an unknown label then
fails before any training starts -- with the reader's file:line message -- rather than hours
into a run. Batches are later cut to their longest real row (see `finetune.loop.batches`), so
encoding to the full ``max_len`` costs memory, not compute.

Every task is read, encoded and scored by its registered family (`folnet.train.tasks`); this
module only decides which splits a run needs and checks ``--data`` against the family. The
family reads each split from the task's original files or, when those are absent, from a
Hugging Face datasets format in the same folder (`folnet.train.tasks.hfdatasets`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer

from folnet.arch.head_table import head_for_task
from folnet.errors import FolnetError, choices
from folnet.train.data.tokenizer import FolnetTokenizer
from folnet.train.finetune.config import FinetuneConfig, Hyper
from folnet.train.tasks import TASKS, EncodedSplit, TaskSpec, family_of

__all__ = ["TaskData", "headline_split", "label_names", "load_run_data", "load_task_data",
           "resolve_task", "run_options", "task_head"]


def resolve_task(name: str | TaskSpec) -> TaskSpec:
    """The registered task called ``name`` (``--task``)."""
    if isinstance(name, TaskSpec):
        return name
    if name not in TASKS:
        raise FolnetError(f"--task {name!r} is unknown: expected {choices(TASKS)}")
    return TASKS[name]


def task_head(task: TaskSpec) -> tuple[str, int]:
    """The model head and its output width for ``task``: the registered head whose
    ``task_kinds`` claim the task's kind (`folnet.arch.head_table.head_for_task`: the last
    registered, so a head of yours takes a kind over from the built-in one), with 2 outputs
    (start, end) for QA and one per label otherwise."""
    head = head_for_task(task.kind)
    return head, 2 if task.kind == "qa" else task.num_labels


def headline_split(task: TaskSpec, splits: list[str]) -> str:
    """The split whose median main metric is the run's headline: the test split where one is
    labelled and evaluated (kinship, CLUTRR), else the first validation split."""
    return "test" if "test" in splits else splits[0]


def label_names(task: TaskSpec) -> list[str] | None:
    """The label list a classifier's outputs index (None for regression and QA)."""
    return list(task.labels) if task.kind == "classification" and task.labels else None


@dataclass
class TaskData:
    """A task (with CLUTRR's label set filled in) and its encoded splits."""

    task: TaskSpec
    train: EncodedSplit | None
    evals: dict[str, EncodedSplit]


def _check_data(spec: TaskSpec, data: str | Path | None) -> None:
    """``--data`` as the task's family wants it: a directory, or nothing for generated data
    (the word naming a generated task is accepted as its data)."""
    generated = [name for name in TASKS if family_of(name).generated]
    if family_of(spec).generated:
        if data not in (None, "", spec.name):
            raise FolnetError(f"--data {str(data)!r}: the {spec.name} task is generated, give "
                              f"--data {spec.name} or no --data")
        return
    if data is None or str(data) in ("", *generated):
        raise FolnetError(f"--data is required for {spec.name}: the directory holding its "
                          f"{' / '.join(spec.split_files('train'))} files, or its splits in a "
                          "Hugging Face datasets format (a save_to_disk folder, or "
                          "train.parquet / .arrow / .jsonl / .json / .csv files)")
    if not Path(data).is_dir():
        raise FolnetError(f"--data {str(data)!r} is not a directory (give the folder that holds "
                          "the split files or the save_to_disk dataset)")


def load_task_data(task: str | TaskSpec, data: str | Path | None, tokenizer: Tokenizer, *,
                   options: Mapping[str, Any], splits: Sequence[str] | None = None,
                   train: bool = True, labels: Sequence[str] | None = None,
                   max_train_examples: int | None = None,
                   max_eval_examples: int | None = None) -> TaskData:
    """Read and encode the train split (when ``train``) and ``splits`` (default: the task's
    evaluation splits).

    ``labels`` fixes the label set (a finetuned model's own, when evaluating it): any other
    label in the data is then an error naming the file and line. ``options`` are the run's
    settings, passed to the task's family (``max_len``, the SQuAD and kinship options).
    """
    spec = resolve_task(task)
    if labels is not None and spec.kind == "classification":
        spec = dataclasses.replace(spec, labels=tuple(labels))
    wanted = list(spec.eval_splits if splits is None else splits)
    for split in wanted:
        spec.split_files(split)  # an unknown split name lists the task's splits
    _check_data(spec, data)
    family = family_of(spec)
    learns_labels = spec.labels is None and spec.kind == "classification"  # CLUTRR
    names = list(dict.fromkeys(["train", *wanted] if train or learns_labels else wanted))
    read = family.read(spec, data, names, options)
    spec = read[names[0]].task

    def encode(name: str, limit: int | None) -> EncodedSplit:
        split = read[name].head(limit)
        if not split.examples:
            raise FolnetError(f"{spec.name} split {name!r} ({split.source}) has no examples")
        return family.encode(spec, split, tokenizer, options)

    train_split = None
    if train:
        train_split = encode("train", max_train_examples)
        unlabelled = spec.kind != "qa" and any(label is None for label in train_split.labels)
        if unlabelled or not train_split.labelled:
            raise FolnetError(f"{spec.name} train split ({train_split.source}) has unlabelled "
                              f"examples; training needs a label on every one")
    evals = {name: encode(name, max_eval_examples) for name in wanted}
    return TaskData(spec, train_split, evals)


def run_options(config: FinetuneConfig, hyper: Hyper) -> dict[str, Any]:
    """The settings a task family reads: the run's options with ``max_len`` and ``doc_stride``
    resolved for the task."""
    return {**config.to_dict(), "max_len": hyper.max_len, "doc_stride": hyper.doc_stride}


def load_run_data(config: FinetuneConfig, tokenizer: FolnetTokenizer, hyper: Hyper, *,
                  train: bool = True, labels: list[str] | None = None,
                  splits: list[str] | None = None) -> TaskData:
    """The task's splits as `config` asks for them, encoded with ``tokenizer``."""
    return load_task_data(config.task, config.data, tokenizer.tokenizer,
                          options=run_options(config, hyper), splits=splits, train=train,
                          labels=labels, max_train_examples=config.max_train_examples,
                          max_eval_examples=config.max_eval_examples)
