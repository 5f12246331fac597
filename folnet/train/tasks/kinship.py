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
import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from folnet.atomic_write import atomic_write_json
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
from folnet.train.tasks.clutrr import CLUTRR
from folnet.train.tasks.generation import encode_by_kind, generation_twin, score_by_kind
from folnet.train.tasks.registry import TaskFamily

__all__ = ["FAMILY", "KINSHIP", "KINSHIP_GENERATE", "KINSHIP_SYMBOLIC",
           "KINSHIP_SYMBOLIC_GENERATE", "kinship_metrics", "kinship_questions",
           "load_questions", "questions_file", "save_questions"]

# CLUTRR's kind, metric, input length and recipe (paper: 100 epochs, lr 5e-5, batch 16), with
# the generator's fixed label set and its three generated splits.
KINSHIP = dataclasses.replace(CLUTRR, name="kinship", family="kinship", labels=RELATIONS,
                              splits=(("train", ()), ("validation", ()), ("test", ())),
                              eval_splits=("validation", "test"))
# The same questions with facts as entity and relation tokens (`kinship.symbolic`): what a small
# model learns in minutes, so the operator ablation (`make demo`) measures reasoning, not reading.
# 128 tokens hold the longest chain (k = 10) with 10 distractors: 20 facts of 5 tokens.
KINSHIP_SYMBOLIC = dataclasses.replace(KINSHIP, name="kinship/symbolic", seq_len=128)
# Both answered by generation (`folnet.train.tasks.generation`): the relation's word, scored
# per chain length as the classifiers are.
KINSHIP_GENERATE = generation_twin(KINSHIP, KINSHIP.metrics)
KINSHIP_SYMBOLIC_GENERATE = generation_twin(KINSHIP_SYMBOLIC, KINSHIP.metrics)
_RENDER = {KINSHIP.name: lambda q: q, KINSHIP_SYMBOLIC.name: symbolic,
           KINSHIP_GENERATE.name: lambda q: q, KINSHIP_SYMBOLIC_GENERATE.name: symbolic}

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


#: Generated questions by generator arguments: the seeds of an ablation row (one process)
#: finetune on the same questions, which take seconds to generate. The last two are kept.
_MEMO: dict[tuple[tuple[str, Any], ...], dict[str, list[KinshipExample]]] = {}


def _keyed(pairs: Iterable[Sequence[Any]]) -> tuple[tuple[str, Any], ...]:
    """(argument, value) pairs as a memo key: lists made tuples (options and JSON hold lists)."""
    return tuple((a, tuple(v) if isinstance(v, list) else v) for a, v in pairs)


def _arguments(options: Mapping[str, Any]) -> tuple[tuple[str, Any], ...]:
    """`systematic_split`'s arguments as a run with ``options`` calls it (lists as tuples)."""
    return _keyed((argument, value) for key, argument in _GENERATOR_OPTIONS.items()
                  if (value := options.get(key)) is not None)


def _remember(arguments: tuple, questions: dict[str, list[KinshipExample]]) -> None:
    _MEMO.pop(arguments, None)
    while len(_MEMO) >= 2:
        del _MEMO[next(iter(_MEMO))]
    _MEMO[arguments] = questions


def kinship_questions(options: Mapping[str, Any]) -> dict[str, list[KinshipExample]]:
    """The generated questions of every split (``train``, ``validation``, ``test``) as a run
    with ``options`` (a finetuning run's settings) reads them, before rendering: what an
    ablation holds out of its pretraining corpus (`folnet.train.data.kinship.heldout`)."""
    arguments = _arguments(options)
    if arguments not in _MEMO:
        _remember(arguments, systematic_split(**dict(arguments)))
    return _MEMO[arguments]


def _listed(arguments: tuple[tuple[str, Any], ...]) -> list[list[Any]]:
    """The generator's arguments as JSON holds them (tuples as lists)."""
    return [[a, list(v) if isinstance(v, tuple) else v] for a, v in arguments]


def questions_file(folder: Path, options: Mapping[str, Any]) -> Path:
    """Where `save_questions` writes the questions of ``options`` in ``folder``: named by a
    digest of the generator's arguments."""
    key = json.dumps(_listed(_arguments(options)))
    return folder / f"kinship-questions-{hashlib.sha256(key.encode()).hexdigest()[:16]}.json"


def save_questions(folder: Path, options: Mapping[str, Any]) -> Path:
    """Write `kinship_questions` of ``options`` into ``folder`` (JSON, with the generator's
    arguments; `questions_file`), so that other processes of one run read them
    (`load_questions`) instead of generating them again: an ablation's parent generates them
    to hold them out of its corpora, and each seed process finetunes on them."""
    arguments = _arguments(options)
    path = questions_file(folder, options)
    splits = {name: [[q.story, q.query, q.label, q.k, q.first, q.second,
                      [list(f) for f in q.facts], q.family] for q in questions]
              for name, questions in kinship_questions(options).items()}
    atomic_write_json(path, {"arguments": _listed(arguments), "splits": splits})
    return path


def load_questions(folder: Path, options: Mapping[str, Any]) -> bool:
    """Take the questions of ``options`` from the file `save_questions` wrote into ``folder``;
    False, taking nothing, when it is missing, holds other arguments, or is not what
    `save_questions` writes (then `kinship_questions` generates them)."""
    arguments = _arguments(options)
    path = questions_file(folder, options)
    if arguments in _MEMO or not path.is_file():
        return arguments in _MEMO
    try:
        data = json.loads(path.read_text())
        if _keyed(data["arguments"]) != arguments:
            return False
        questions = {name: [_question(row) for row in rows]
                     for name, rows in data["splits"].items()}
    except (ValueError, KeyError, TypeError, AttributeError):
        return False
    if set(questions) != {"train", "validation", "test"}:
        return False
    _remember(arguments, questions)
    return True


def _question(row: list) -> KinshipExample:
    """One stored question, its fields' types checked (TypeError, ValueError otherwise)."""
    story, query, label, k, first, second, facts, family = row
    texts = (story, query, label, first, second, family)
    if not all(isinstance(t, str) for t in texts) or type(k) is not int or k < 1:
        raise TypeError("not a stored question")
    told = tuple(tuple(f) for f in facts)
    if not all(len(f) == 4 and all(isinstance(w, str) for w in f) for f in told):
        raise TypeError("not a stored fact")
    return KinshipExample(story, query, label, k, first, second, told, family)


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
    """Classification or generation rows; metrics per chain length (`kinship_metrics`)."""
    ks = split.columns["k"]
    train_k = options.get("kinship_train_k", TRAIN_K)

    def metrics(chosen: list[int], gold: list[int], rows: list[int]) -> dict[str, float]:
        return kinship_metrics(chosen, gold, [ks[i] for i in rows], train_k)

    return score_by_kind(spec, split, outputs, options, class_metrics=metrics)


FAMILY = TaskFamily("kinship", (KINSHIP, KINSHIP_SYMBOLIC, KINSHIP_GENERATE,
                                KINSHIP_SYMBOLIC_GENERATE),
                    read=_read, encode=encode_by_kind, score=_score, generated=True)
