"""Scoring a model on a task's evaluation splits, prediction files, and ``folnet evaluate``.

Every split is scored by its task's family (`folnet.train.tasks.registry.TaskFamily`: the task's
own metrics; SQuAD 2.0 with the official no-answer rule; the kinship task per chain length with
its majority baseline), and every prediction is written out: ``predictions/<split>.tsv`` with
one row per item (id, prediction, gold label, then the family's columns such as the kinship
chain length k) and, where the family has one, an official ``predictions/<split>.json``
(SQuAD's {question id: answer text}). An unlabelled split (the GLUE test files) gets
predictions and no metrics, which is what a leaderboard submission needs.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from folnet.atomic_write import atomic_write_json, atomic_write_text, remove_leftovers, write_faults
from folnet.errors import FolnetError
from folnet.train.engine.distributed import resolve_device
from folnet.train.engine.lock import RunLock
from folnet.train.engine.outdir import check_out
from folnet.train.finetune.config import FinetuneConfig
from folnet.train.finetune.data import (
    TaskData,
    headline_split,
    load_run_data,
    resolve_task,
    run_options,
)
from folnet.train.finetune.generation import generate_split
from folnet.train.finetune.loop import batches, predict
from folnet.train.finetune.warm_start import load_finetuned
from folnet.train.tasks import TaskSpec, family_of

__all__ = ["evaluate_checkpoint", "evaluate_splits", "read_predictions", "write_eval_json",
           "write_predictions"]

Results = dict[str, tuple[dict[str, float], list[dict[str, Any]]]]
_FIRST_COLUMNS = ("id", "prediction", "label")


def evaluate_splits(model: nn.Module, data: TaskData, *, options: Mapping[str, Any],
                    splits: Sequence[str] | None = None, batch_size: int = 64,
                    device: torch.device | str = "cpu", precision: str = "fp32") -> Results:
    """Metrics and prediction rows of ``model`` on each evaluation split of ``data``;
    ``options`` are the run's settings the task's family reads (see `finetune.data`)."""
    family = family_of(data.task)
    results = {}
    for name in (splits if splits is not None else list(data.evals)):
        split = data.evals[name]
        if data.task.kind == "generation":  # the answer generated (split.context: Answers)
            answers = split.context
            outputs = generate_split(model, split.tensors, end=answers.end, pad=answers.pad,
                                     max_new_tokens=answers.max_new_tokens,
                                     batch_size=batch_size, device=device,
                                     precision=precision)
        else:
            width = int(split.tensors["input_ids"].shape[-1])
            outputs = predict(model, batches(split.tensors, batch_size), device=device,
                              precision=precision, full_length=width)
        results[name] = family.score(data.task, split, outputs, options)
    return results


def _tsv(rows: Sequence[Mapping[str, Any]]) -> str:
    buffer = io.StringIO()
    columns = [*_FIRST_COLUMNS, *(k for k in (rows[0] if rows else {}) if k not in _FIRST_COLUMNS)]
    writer = csv.DictWriter(buffer, fieldnames=columns, delimiter="\t", lineterminator="\n",
                            extrasaction="ignore")
    writer.writeheader()
    writer.writerows(rows)
    return buffer.getvalue()


def write_predictions(directory: Path, task: TaskSpec, split: str,
                      rows: Sequence[Mapping[str, Any]]) -> list[Path]:
    """``<split>.tsv`` (and the family's official ``<split>.json``) under ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    paths = [atomic_write_text(directory / f"{split}.tsv", _tsv(rows))]
    official = family_of(task).official
    if official is not None:
        paths.append(atomic_write_json(directory / f"{split}.json", official(list(rows))))
    return paths


def read_predictions(path: str | Path) -> list[dict[str, str]]:
    """The rows of a ``<split>.tsv`` prediction file (a convenience for tests and notebooks)."""
    text = Path(path).read_text(encoding="utf-8")
    return list(csv.DictReader(io.StringIO(text), delimiter="\t"))


def write_eval_json(path: Path, payload: Mapping[str, Any]) -> Path:
    """``eval.json`` with keys sorted, written atomically."""
    return atomic_write_json(path, json.loads(json.dumps(payload)))


def evaluate_checkpoint(model_dir: str | Path, out: str | Path, *, task: str | None = None,
                        data: str | None = None, splits: Sequence[str] | None = None,
                        batch_size: int = 64, device: str = "auto", precision: str = "fp32",
                        tokenizer: str | None = None, max_eval_examples: int | None = None
                        ) -> dict[str, Any]:
    """Score a finetuned model (``folnet finetune``'s ``OUT/model``, or OUT itself) on
    ``splits`` (default: the task's evaluation splits); write ``OUT/eval.json`` and
    ``OUT/predictions/<split>.tsv``; return the eval.json payload.

    Inputs are encoded as in training (max_len, SQuAD windows and decoding, the kinship
    generator's options are read from the model's config.json), with the model's own label
    set: a label outside it in the data is an error naming the file and line.
    """
    out = check_out(out, what="evaluation")  # before the model is even read
    model, tok, meta = load_finetuned(model_dir, tokenizer)
    saved_task = meta.get("task")
    if task is not None and saved_task is not None and resolve_task(task).name != saved_task:
        raise FolnetError(f"--model {str(model_dir)!r} was finetuned on {saved_task!r}, not "
                          f"{task!r}: evaluate it with --task {saved_task}")
    task_name = task or saved_task
    if task_name is None:
        raise FolnetError(f"--task is required: {str(model_dir)!r} does not record its task")
    trained = dict((meta.get("finetune") or {}).get("config") or {})
    known = {k: v for k, v in trained.items() if k in FinetuneConfig.__dataclass_fields__}
    config = FinetuneConfig.from_dict({**known, "task": task_name, "data": data,
                                       "tokenizer": tokenizer, "device": device,
                                       "precision": precision, "eval_batch_size": batch_size,
                                       "max_eval_examples": max_eval_examples, "out": str(out)})
    hyper = config.hyper(resolve_task(task_name))
    data_ = load_run_data(config, tok, hyper, train=False, labels=meta.get("labels"),
                          splits=list(splits) if splits else None)
    results = evaluate_splits(model, data_, options=run_options(config, hyper),
                              batch_size=batch_size, device=resolve_device(device),
                              precision=precision)
    metrics = {name: m for name, (m, _rows) in results.items()}
    headline = headline_split(data_.task, list(metrics))
    payload = {"task": data_.task.name, "model": str(model_dir), "data": data,
               "main_metric": data_.task.main_metric, "headline_split": headline,
               "headline": metrics[headline].get(data_.task.main_metric), "metrics": metrics,
               "predictions": {s: f"predictions/{s}.tsv" for s in metrics},
               "max_len": hyper.max_len}
    # OUT is written only here: held against a finetuning run or evaluation writing it too
    with RunLock(out, what="evaluation", on_acquire=remove_leftovers), write_faults(out):
        for name, (_metrics, rows) in results.items():
            write_predictions(out / "predictions", data_.task, name, rows)
        write_eval_json(out / "eval.json", payload)
    return payload
