"""Scoring a model on a task's evaluation splits, prediction files, and ``folnet evaluate``.

Every split is scored with the task's own metrics (`TaskSpec.metrics`; SQuAD 2.0 with the
official no-answer rule; the kinship task per chain length with its majority baseline), and
every prediction is written out: ``predictions/<split>.tsv`` with one row per item (id,
prediction, gold label, and the chain length k for kinship) and, for SQuAD, the official
``predictions/<split>.json`` ({question id: answer text}). An unlabelled split (the GLUE test
files) gets predictions and no metrics, which is what a leaderboard submission needs.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from folnet.errors import FolnetError
from folnet.io import atomic_write_json, atomic_write_text
from folnet.train.engine.distributed import resolve_device
from folnet.train.finetune.data import EncodedSplit, TaskData
from folnet.train.finetune.loop import batches, predict
from folnet.train.tasks import TaskSpec, postprocess_predictions
from folnet.train.tasks.kinship import kinship_metrics
from folnet.train.tasks.metrics import compute_metrics, squad_evaluate

__all__ = ["SquadOptions", "evaluate_checkpoint", "evaluate_splits", "read_predictions",
           "score_split", "write_predictions"]


@dataclass(frozen=True)
class SquadOptions:
    """Answer decoding settings (see `folnet.train.tasks.squad.postprocess_predictions`)."""

    n_best: int = 20
    max_answer_len: int = 30
    null_threshold: float = 0.0


def _class_ids(task: TaskSpec, split: EncodedSplit) -> tuple[list[int], list[int]]:
    """(row indices, gold class ids) of the labelled items."""
    rows, gold = [], []
    for i, (guid, label) in enumerate(zip(split.ids, split.labels, strict=True)):
        if label is not None:
            rows.append(i)
            gold.append(task.label_id(str(label), f"{split.source}: example {guid!r}"))
    return rows, gold


def score_split(task: TaskSpec, split: EncodedSplit, outputs: Mapping[str, torch.Tensor], *,
                squad: SquadOptions = SquadOptions(), train_k: Sequence[int] = (2, 3)
                ) -> tuple[dict[str, float], list[dict[str, Any]]]:
    """(metrics, prediction rows) of one split from the model's outputs on it.

    Metrics are empty when the split has no labels. Rows hold ``id``, ``prediction`` and
    ``label`` ("" when unknown), plus ``k`` for the kinship task.
    """
    if task.kind == "qa":
        if split.squad_examples is None or split.features is None:
            raise FolnetError(f"split {split.name!r} was not encoded for QA")
        answers = postprocess_predictions(
            split.squad_examples, split.features, outputs["start_logits"],
            outputs["end_logits"], n_best=squad.n_best, max_answer_len=squad.max_answer_len,
            null_threshold=squad.null_threshold)
        metrics = squad_evaluate(split.squad_examples, answers)
        rows = [{"id": ex.qid, "prediction": answers[ex.qid],
                 "label": " || ".join(a.text for a in ex.answers)}
                for ex in split.squad_examples]
        return metrics, rows
    logits = outputs["logits"]
    if task.kind == "regression":
        scores = logits[:, 0].tolist()
        rows = [{"id": guid, "prediction": round(score, 6),
                 "label": "" if label is None else label}
                for guid, score, label in zip(split.ids, scores, split.labels, strict=True)]
        labelled = [i for i, label in enumerate(split.labels) if label is not None]
        metrics = {}
        if labelled:
            metrics = compute_metrics(task.metrics, [scores[i] for i in labelled],
                                      [float(split.labels[i]) for i in labelled])
        return metrics, rows
    if task.labels is None:
        raise FolnetError(f"task {task.name!r} has no label set to name its predictions")
    predicted = logits.argmax(-1).tolist()
    rows = [{"id": guid, "prediction": task.labels[p], "label": "" if label is None else label}
            for guid, p, label in zip(split.ids, predicted, split.labels, strict=True)]
    if split.ks is not None:
        for row, k in zip(rows, split.ks, strict=True):
            row["k"] = k
    labelled, gold = _class_ids(task, split)
    if not labelled:
        return {}, rows
    chosen = [predicted[i] for i in labelled]
    if split.ks is not None:
        return kinship_metrics(chosen, gold, [split.ks[i] for i in labelled], train_k), rows
    return compute_metrics(task.metrics, chosen, gold), rows


def evaluate_splits(model: nn.Module, data: TaskData, *, splits: Sequence[str] | None = None,
                    batch_size: int = 64, device: torch.device | str = "cpu",
                    precision: str = "fp32", squad: SquadOptions = SquadOptions(),
                    train_k: Sequence[int] = (2, 3)
                    ) -> dict[str, tuple[dict[str, float], list[dict[str, Any]]]]:
    """Metrics and prediction rows of ``model`` on each evaluation split of ``data``."""
    results = {}
    for name in (splits if splits is not None else list(data.evals)):
        split = data.evals[name]
        width = int(split.tensors["input_ids"].shape[-1])
        outputs = predict(model, batches(split.tensors, batch_size), device=device,
                          precision=precision, full_length=width)
        results[name] = score_split(data.task, split, outputs, squad=squad, train_k=train_k)
    return results


def _tsv(rows: Sequence[Mapping[str, Any]]) -> str:
    buffer = io.StringIO()
    columns = ["id", "prediction", "label", *(["k"] if rows and "k" in rows[0] else [])]
    writer = csv.DictWriter(buffer, fieldnames=columns, delimiter="\t", lineterminator="\n",
                            extrasaction="ignore")
    writer.writeheader()
    writer.writerows(rows)
    return buffer.getvalue()


def write_predictions(directory: Path, task: TaskSpec, split: str,
                      rows: Sequence[Mapping[str, Any]]) -> list[Path]:
    """``<split>.tsv`` (and SQuAD's official ``<split>.json``) under ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    paths = [atomic_write_text(directory / f"{split}.tsv", _tsv(rows))]
    if task.kind == "qa":
        paths.append(atomic_write_json(directory / f"{split}.json",
                                       {row["id"]: row["prediction"] for row in rows}))
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
    from folnet.train.finetune.checkpoint import load_finetuned
    from folnet.train.finetune.config import FinetuneConfig
    from folnet.train.finetune.data import resolve_task
    from folnet.train.finetune.run import headline_split, load_run_data

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
    spec = resolve_task(task_name)
    hyper = config.hyper(spec)
    labels = meta.get("labels")
    data_ = load_run_data(config, tok, hyper, train=False, labels=labels,
                          splits=list(splits) if splits else None)
    resolved = resolve_device(device)
    results = evaluate_splits(
        model, data_, batch_size=batch_size, device=resolved, precision=precision,
        squad=SquadOptions(config.n_best, config.max_answer_len, config.null_threshold),
        train_k=config.kinship_train_k)
    out = Path(out)
    for name, (_metrics, rows) in results.items():
        write_predictions(out / "predictions", data_.task, name, rows)
    metrics = {name: m for name, (m, _rows) in results.items()}
    headline = headline_split(data_.task, list(metrics))
    payload = {"task": data_.task.name, "model": str(model_dir), "data": data,
               "main_metric": data_.task.main_metric, "headline_split": headline,
               "headline": metrics[headline].get(data_.task.main_metric), "metrics": metrics,
               "predictions": {s: f"predictions/{s}.tsv" for s in metrics},
               "max_len": hyper.max_len}
    write_eval_json(out / "eval.json", payload)
    return payload
