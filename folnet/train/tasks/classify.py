"""The encoder and scorer of every task that labels a text or a text pair (GLUE, FOLIO, CLUTRR,
kinship): the families other than SQuAD's use these two functions as they are, or wrap them.

Scoring turns the head's outputs into one prediction row per item and computes the task's
metrics on the labelled items only, so an unlabelled split (the GLUE test files) gets
predictions and no metrics -- what a leaderboard submission needs.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from tokenizers import Tokenizer

from folnet.errors import FolnetError
from folnet.train.tasks.base import EncodedSplit, SplitData, TaskSpec
from folnet.train.tasks.encode import encode_examples
from folnet.train.tasks.metrics import compute_metrics

__all__ = ["ClassMetrics", "encode_split", "score_split"]

#: Metrics of a classification split: ``(predicted ids, gold ids, row of each) -> metrics``.
ClassMetrics = Callable[[list[int], list[int], list[int]], dict[str, float]]


def encode_split(spec: TaskSpec, split: SplitData, tokenizer: Tokenizer,
                 options: Mapping[str, Any]) -> EncodedSplit:
    """`encode_examples` at ``options["max_len"]`` (default: the task's length)."""
    examples = split.examples
    tensors = encode_examples(spec, examples, tokenizer,
                              max_len=options.get("max_len") or spec.seq_len)
    return EncodedSplit(split.split, split.source, [ex.guid for ex in examples],
                        [ex.label for ex in examples], tensors,
                        columns={name: list(values) for name, values in split.columns.items()})


def _rows(split: EncodedSplit, predictions: Sequence[Any]) -> list[dict[str, Any]]:
    """One row per item: id, prediction, gold label ("" when unknown), then the columns."""
    rows = [{"id": guid, "prediction": p, "label": "" if label is None else label}
            for guid, p, label in zip(split.ids, predictions, split.labels, strict=True)]
    for name, values in split.columns.items():
        for row, value in zip(rows, values, strict=True):
            row[name] = value
    return rows


def score_split(spec: TaskSpec, split: EncodedSplit, outputs: Mapping[str, torch.Tensor],
                options: Mapping[str, Any], class_metrics: ClassMetrics | None = None
                ) -> tuple[dict[str, float], list[dict[str, Any]]]:
    """(metrics, prediction rows) from the head's ``logits`` (N, labels) or (N, 1).

    Regression rows hold the score (6 decimals); classification rows the label name, and the
    metrics are ``class_metrics`` when given (the kinship task's per-length accuracy), else
    the task's own.
    """
    logits = outputs["logits"]
    if spec.kind == "regression":
        scores = logits[:, 0].tolist()  # (N,)
        rows = _rows(split, [round(score, 6) for score in scores])
        labelled = [i for i, label in enumerate(split.labels) if label is not None]
        metrics = {}
        if labelled:
            metrics = compute_metrics(spec.metrics, [scores[i] for i in labelled],
                                      [float(split.labels[i]) for i in labelled])
        return metrics, rows
    if spec.labels is None:
        raise FolnetError(f"task {spec.name!r} has no label set to name its predictions")
    predicted = logits.argmax(-1).tolist()  # (N,) class ids
    rows = _rows(split, [spec.labels[p] for p in predicted])
    labelled, gold = [], []
    for i, (guid, label) in enumerate(zip(split.ids, split.labels, strict=True)):
        if label is not None:
            labelled.append(i)
            gold.append(spec.label_id(str(label), f"{split.source}: example {guid!r}"))
    if not labelled:
        return {}, rows
    chosen = [predicted[i] for i in labelled]
    if class_metrics is not None:
        return class_metrics(chosen, gold, labelled), rows
    return compute_metrics(spec.metrics, chosen, gold), rows
