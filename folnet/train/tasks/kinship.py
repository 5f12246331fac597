"""The generated kinship reasoning task (CLUTRR-style, no files), a registered task family:
``kinship`` (English stories) and ``kinship/symbolic`` (the same questions as entity and
relation tokens).

Why a task of its own next to CLUTRR: the generator (`folnet.train.data.kinship`) needs no
download, so the systematic-generalisation experiment of the paper's Appendix C (train on chains
of k = 2, 3 facts, test on k = 2 ... 10) runs anywhere and always on the same data. Each question
becomes a sentence pair exactly as CLUTRR's do -- the story as segment A, the query ("How is X
related to Y?") as segment B -- and its label is one of the 22 relation words.

The splits are ``train`` and ``validation`` (both over the training chain lengths) and
``test`` (every tested length). Besides accuracy, every split reports accuracy per chain length,
on the trained lengths ("seen") and the longer ones ("unseen"), and the majority-class baseline
on the same questions: the bar a model must clear to show it reasons at all. Prediction files
carry each question's chain length ``k``.

The generator's options come from the run (``kinship_train_size``, ``kinship_test_per_k``,
``kinship_train_k``, ``kinship_test_k``, ``kinship_distractors``, ``data_seed``); those not given
take the generator's own defaults.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from folnet.errors import FolnetError
from folnet.train.data.kinship import (
    RELATIONS,
    TRAIN_K,
    KinshipExample,
    majority_baseline,
    symbolic,
    systematic_split,
)
from folnet.train.tasks.base import EncodedSplit, Example, SplitData, TaskSpec
from folnet.train.tasks.classify import encode_split, score_split
from folnet.train.tasks.clutrr import CLUTRR
from folnet.train.tasks.registry import TaskFamily

__all__ = ["FAMILY", "KINSHIP", "KINSHIP_SYMBOLIC", "kinship_metrics", "kinship_questions"]

# CLUTRR's kind, metric, input length and recipe (paper: 100 epochs, lr 5e-5, batch 16), with
# the generator's fixed label set and its three generated splits.
KINSHIP = dataclasses.replace(CLUTRR, name="kinship", family="kinship", labels=RELATIONS,
                              splits=(("train", ()), ("validation", ()), ("test", ())),
                              eval_splits=("validation", "test"))
# The same questions with facts as entity and relation tokens (`kinship.symbolic`): what a small
# model learns in minutes, so the operator ablation (`make demo`) measures reasoning, not reading.
# 128 tokens hold the longest chain (k = 10) with 10 distractors: 20 facts of 5 tokens.
KINSHIP_SYMBOLIC = dataclasses.replace(KINSHIP, name="kinship/symbolic", seq_len=128)
_RENDER = {KINSHIP.name: lambda q: q, KINSHIP_SYMBOLIC.name: symbolic}

# run option -> argument of `systematic_split`
_GENERATOR_OPTIONS = {"kinship_train_size": "train_size", "kinship_test_per_k": "test_size_per_k",
                      "kinship_train_k": "train_k", "kinship_test_k": "test_k",
                      "kinship_distractors": "distractors", "data_seed": "seed"}


def kinship_metrics(predictions: Sequence[int], labels: Sequence[int], ks: Sequence[int],
                    train_k: Sequence[int]) -> dict[str, float]:
    """Accuracy overall, per chain length (``accuracy_k<k>``), on the trained lengths
    (``accuracy_seen``) and the others (``accuracy_unseen``), with the majority-class baseline
    on the same questions (``majority_baseline``, ``majority_baseline_seen``, and per k).

    Predictions and labels are class ids into `RELATIONS`.
    """
    if not (len(predictions) == len(labels) == len(ks)) or not ks:
        raise FolnetError(f"kinship_metrics got {len(predictions)} predictions, {len(labels)} "
                          f"labels and {len(ks)} chain lengths (need equal, non-zero counts)")

    def scores(rows: list[int]) -> tuple[float, float]:
        correct = sum(predictions[i] == labels[i] for i in rows)
        questions = [KinshipExample("", "", RELATIONS[labels[i]], ks[i], "", "") for i in rows]
        return correct / len(rows), majority_baseline(questions)

    out: dict[str, float] = {}
    out["accuracy"], out["majority_baseline"] = scores(list(range(len(ks))))
    seen = [i for i, k in enumerate(ks) if k in set(train_k)]
    unseen = [i for i, k in enumerate(ks) if k not in set(train_k)]
    if seen:
        out["accuracy_seen"], out["majority_baseline_seen"] = scores(seen)
    if unseen:
        out["accuracy_unseen"], out["majority_baseline_unseen"] = scores(unseen)
    for k in sorted(set(ks)):
        rows = [i for i, kk in enumerate(ks) if kk == k]
        out[f"accuracy_k{k}"], out[f"majority_baseline_k{k}"] = scores(rows)
    return out


@functools.lru_cache(maxsize=2)
def _questions(arguments: tuple[tuple[str, Any], ...]) -> dict[str, list[KinshipExample]]:
    """`systematic_split` remembered: the seeds of an ablation row (one process) finetune on
    the same questions, which take seconds to generate."""
    return systematic_split(**dict(arguments))


def kinship_questions(options: Mapping[str, Any]) -> dict[str, list[KinshipExample]]:
    """The generated questions of every split (``train``, ``validation``, ``test``) as a run
    with ``options`` (a finetuning run's settings) reads them, before rendering: what an
    ablation holds out of its pretraining corpus (`folnet.train.data.kinship.heldout`)."""
    return _questions(tuple(
        (argument, tuple(value) if isinstance(value, list) else value)
        for key, argument in _GENERATOR_OPTIONS.items()
        if (value := options.get(key)) is not None))


def _read(spec: TaskSpec, data_dir: str | Path | None, splits: Sequence[str],
          options: Mapping[str, Any]) -> dict[str, SplitData]:
    """Generate the split (deterministic in ``data_seed``): sentence-pair `Example`s with guids
    ``<split>-<index>-k<k>`` and the chain length of each as column ``k``."""
    questions = kinship_questions(options)
    out = {}
    render = _RENDER[spec.name]
    for name in splits:
        chosen = [render(q) for q in questions[name]]
        examples = tuple(Example(f"{name}-{i}-k{q.k}", q.story, q.query, q.label)
                         for i, q in enumerate(chosen))
        out[name] = SplitData(spec, name, (), examples, {"k": tuple(q.k for q in chosen)})
    return out


def _score(spec: TaskSpec, split: EncodedSplit, outputs: Mapping[str, torch.Tensor],
           options: Mapping[str, Any]) -> tuple[dict[str, float], list[dict[str, Any]]]:
    """Classification rows; metrics per chain length (`kinship_metrics`)."""
    ks = split.columns["k"]
    train_k = options.get("kinship_train_k", TRAIN_K)

    def metrics(chosen: list[int], gold: list[int], rows: list[int]) -> dict[str, float]:
        return kinship_metrics(chosen, gold, [ks[i] for i in rows], train_k)

    return score_split(spec, split, outputs, options, class_metrics=metrics)


FAMILY = TaskFamily("kinship", (KINSHIP, KINSHIP_SYMBOLIC), read=_read, encode=encode_split,
                    score=_score, generated=True)
