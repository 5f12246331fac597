"""The data of a finetuning run: every split read, checked and encoded into tensors once.

Why encode up front: finetuning sets are small next to pretraining corpora, each run of a
multi-seed finetune reuses the same tensors, and a malformed file or an unknown label then
fails before any training starts -- with the reader's file:line message -- rather than hours
into a run. Batches are later cut to their longest real row (see `finetune_loop.batches`), so
encoding to the full ``max_len`` costs memory, not compute.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from tokenizers import Tokenizer

from folnet.errors import FolnetError, choices
from folnet.train.tasks import (
    TASKS,
    SquadExample,
    SquadFeature,
    TaskSpec,
    encode_examples,
    encode_squad,
    features_to_tensors,
    get_task,
    read_split,
)
from folnet.train.tasks.kinship import KINSHIP_TASK, kinship_examples, kinship_split

__all__ = ["EncodedSplit", "TaskData", "load_task_data", "resolve_task", "task_names"]


def task_names() -> tuple[str, ...]:
    """Every task ``folnet finetune --task`` accepts."""
    return (*TASKS, KINSHIP_TASK.name)


def resolve_task(name: str | TaskSpec) -> TaskSpec:
    """The registered task called ``name``, the generated kinship task included."""
    if isinstance(name, TaskSpec):
        return name
    if name == KINSHIP_TASK.name:
        return KINSHIP_TASK
    if name not in TASKS:
        raise FolnetError(f"--task {name!r} is unknown: expected {choices(task_names())}")
    return get_task(name)


@dataclass
class EncodedSplit:
    """One split ready for the model.

    ``ids`` name the items a prediction file lists (example guids, or SQuAD question ids);
    ``labels`` are their gold labels as read (label names, scores, or None when the split is
    unlabelled); ``tensors`` are the model inputs, one row per item -- per window for SQuAD,
    whose ``features`` map windows back to questions. ``ks`` holds each kinship question's
    chain length.
    """

    name: str
    source: str
    ids: list[str]
    labels: list[Any]
    tensors: dict[str, torch.Tensor]
    ks: list[int] | None = None
    squad_examples: tuple[SquadExample, ...] | None = None
    features: list[SquadFeature] | None = None

    @property
    def labelled(self) -> bool:
        return any(label is not None for label in self.labels)

    def __len__(self) -> int:
        return len(self.ids)


@dataclass
class TaskData:
    """A task (with CLUTRR's label set filled in) and its encoded splits."""

    task: TaskSpec
    train: EncodedSplit | None
    evals: dict[str, EncodedSplit]


def _encode(task: TaskSpec, name: str, source: str, examples: Sequence[Any],
            tokenizer: Tokenizer, max_len: int, doc_stride: int | None,
            max_query_len: int) -> EncodedSplit:
    if not examples:
        raise FolnetError(f"{task.name} split {name!r} ({source}) has no examples")
    if task.kind == "qa":
        features = encode_squad(examples, tokenizer, max_len=max_len,
                                doc_stride=doc_stride or 128, max_query_len=max_query_len)
        return EncodedSplit(name, source, [ex.qid for ex in examples],
                            [None if ex.is_impossible else ex.answers[0].text for ex in examples],
                            features_to_tensors(features), squad_examples=tuple(examples),
                            features=features)
    tensors = encode_examples(task, examples, tokenizer, max_len=max_len)
    return EncodedSplit(name, source, [ex.guid for ex in examples],
                        [ex.label for ex in examples], tensors)


def _limit(examples: Sequence[Any], limit: int | None) -> Sequence[Any]:
    return examples if limit is None else examples[:limit]


def load_task_data(task: str | TaskSpec, data: str | Path | None, tokenizer: Tokenizer, *,
                   max_len: int, splits: Sequence[str] | None = None, train: bool = True,
                   labels: Sequence[str] | None = None, doc_stride: int | None = None,
                   max_query_len: int = 64, max_train_examples: int | None = None,
                   max_eval_examples: int | None = None, kinship: dict[str, Any] | None = None
                   ) -> TaskData:
    """Read and encode the train split (when ``train``) and ``splits`` (default: the task's
    evaluation splits).

    ``labels`` fixes the label set (a finetuned model's own, when evaluating it): any other
    label in the data is then an error naming the file and line. ``kinship`` holds the
    generator's options (train_size, test_per_k, train_k, test_k, seed, distractors).
    """
    spec = resolve_task(task)
    if labels is not None and spec.kind == "classification":
        spec = dataclasses.replace(spec, labels=tuple(labels))
    wanted = list(spec.eval_splits if splits is None else splits)
    for split in wanted:
        spec.split_files(split)  # an unknown split name lists the task's splits
    if spec.family == "kinship":
        if data not in (None, "", "kinship"):
            raise FolnetError(f"--data {str(data)!r}: the kinship task is generated, give "
                              f"--data kinship or no --data")
        options = dict(kinship or {})
        questions = kinship_split(options.get("train_size", 2000), options.get("test_per_k", 100),
                                  options.get("train_k", (2, 3)),
                                  options.get("test_k", tuple(range(2, 11))),
                                  options.get("seed", 0), options.get("distractors", 0))
        read = {name: (questions[name], "generated") for name in ("train", *wanted)}
    else:
        if data is None or str(data) in ("", "kinship"):
            raise FolnetError(f"--data is required for {spec.name}: the directory holding its "
                              f"{' / '.join(spec.split_files('train'))} files")
        if not Path(data).is_dir():
            raise FolnetError(f"--data {str(data)!r} is not a directory")
        read = {}
        if train or (spec.labels is None and spec.kind == "classification"):
            first = read_split(spec, data, "train")  # CLUTRR learns its labels here
            spec = first.task
            read["train"] = (first.examples, ", ".join(map(str, first.paths)))
        for name in wanted:
            if name not in read:
                split = read_split(spec, data, name)
                read[name] = (split.examples, ", ".join(map(str, split.paths)))

    def encode(name: str, limit: int | None) -> EncodedSplit:
        examples, source = read[name]
        examples = _limit(examples, limit)
        ks = None
        if spec.family == "kinship":
            ks = [q.k for q in examples]
            examples = kinship_examples(examples, name)
        encoded = _encode(spec, name, source, examples, tokenizer, max_len, doc_stride,
                          max_query_len)
        encoded.ks = ks
        return encoded

    train_split = None
    if train:
        train_split = encode("train", max_train_examples)
        unlabelled = spec.kind != "qa" and any(label is None for label in train_split.labels)
        if unlabelled or not train_split.labelled:
            raise FolnetError(f"{spec.name} train split ({train_split.source}) has unlabelled "
                              f"examples; training needs a label on every one")
    evals = {name: encode(name, max_eval_examples) for name in wanted}
    return TaskData(spec, train_split, evals)


def label_names(task: TaskSpec) -> list[str] | None:
    """The label list a classifier's outputs index (None for regression and QA)."""
    return list(task.labels) if task.kind == "classification" and task.labels else None

