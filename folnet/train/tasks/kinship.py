"""The generated kinship reasoning task as a finetuning task (CLUTRR-style, no files).

Why a task of its own next to CLUTRR: the generator (`folnet.train.data.kinship`) needs no download,
so the systematic-generalisation experiment of the paper's Appendix C (train on chains of
k = 2, 3 facts, test on k = 2 ... 10) runs anywhere and always on the same data. Each question
becomes a sentence pair exactly as CLUTRR's do -- the story as segment A, the query ("How is X
related to Y?") as segment B -- and its label is one of the 22 relation words.

The splits are ``train`` and ``validation`` (both over the training chain lengths) and
``test`` (every tested length). Besides accuracy, the test split reports accuracy per chain
length, on the trained lengths ("seen") and the longer ones ("unseen"), and the majority-class
baseline on the same questions: the bar a model must clear to show it reasons at all.
"""

from __future__ import annotations

from collections.abc import Sequence

from folnet.errors import FolnetError
from folnet.train.data.kinship import (
    RELATIONS,
    KinshipExample,
    majority_baseline,
    systematic_split,
)
from folnet.train.tasks.base import CLUTRR_DEFAULTS, Example, TaskSpec

__all__ = ["KINSHIP_TASK", "kinship_examples", "kinship_metrics", "kinship_split"]

KINSHIP_TASK = TaskSpec(
    name="kinship",
    kind="classification",
    labels=RELATIONS,
    metrics=("accuracy",),
    main_metric="accuracy",
    splits=(("train", ()), ("validation", ()), ("test", ())),
    eval_splits=("validation", "test"),
    seq_len=256,
    defaults=CLUTRR_DEFAULTS,  # the paper's CLUTRR recipe: 100 epochs, lr 5e-5, batch 16
)


def kinship_split(train_size: int, test_per_k: int, train_k: Sequence[int],
                  test_k: Sequence[int], seed: int = 0,
                  distractors: int = 0) -> dict[str, list[KinshipExample]]:
    """The generated questions of every split (deterministic in ``seed``)."""
    return systematic_split(train_size=train_size, test_size_per_k=test_per_k,
                            train_k=tuple(train_k), test_k=tuple(test_k), seed=seed,
                            distractors=distractors)


def kinship_examples(questions: Sequence[KinshipExample], split: str) -> list[Example]:
    """Sentence-pair `Example`s (story, query) with guids ``<split>-<index>-k<k>``."""
    return [Example(f"{split}-{i}-k{q.k}", q.story, q.query, q.label)
            for i, q in enumerate(questions)]


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
