"""``folnet finetune``: a pretrained FOLNet finetuned on one task over one or more seeds.

`finetune(config)` reads and encodes the task's splits once, then for every seed builds the
task head over the checkpoint's encoder (or, for a generation task, takes the checkpoint's
decoder or encoder-decoder with its LM head: `finetune.generation`), trains it
(`finetune.loop.finetune_model`), scores it on the evaluation splits and writes its
predictions. The headline of ``OUT/eval.json`` is the median over seeds of every metric, as
the paper reports its GLUE/SQuAD/FOLIO numbers (median of five); the model of the seed
closest to that median is kept as ``OUT/model``, so ``folnet evaluate`` on it reproduces a
number of the table.

Layout of OUT::

    eval.json                 headline metrics (median over seeds), per-seed metrics, settings
    run_config.json           the options and the resolved hyper-parameters
    model/                    finetuned model (config.json with task, labels and tokenizer
                              fingerprint, model.safetensors, tokenizer.json, vocab.txt)
    predictions/<split>.tsv   that model's predictions (id, prediction, label[, k])
    seed_<s>/                 log.jsonl, log.csv, metrics.json, predictions/ of each seed

One run per OUT: the run holds OUT's `folnet.train.engine.lock.RunLock` from the moment it has
checked its inputs (or, when OUT exists, before it reads it) to its end, and deletes what a
killed run's writes left there only then. A full disk or a read-only OUT is one line naming
the file (`folnet.atomic_write.write_faults`).
"""

from __future__ import annotations

import dataclasses
import random
import shutil
import statistics
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from folnet.arch import read_metadata
from folnet.atomic_write import atomic_write_json, remove_leftovers, write_faults
from folnet.errors import FolnetError
from folnet.runtime import tune_cpu_allocator
from folnet.train.data.tokenizer import FolnetTokenizer
from folnet.train.engine.distributed import resolve_device
from folnet.train.engine.lock import RunLock
from folnet.train.engine.outdir import FreshStart, check_out
from folnet.train.finetune.config import FinetuneConfig, Hyper
from folnet.train.finetune.data import (
    TaskData,
    headline_split,
    label_names,
    load_run_data,
    resolve_task,
    run_options,
    task_head,
)
from folnet.train.finetune.evaluate import evaluate_splits, write_eval_json, write_predictions
from folnet.train.finetune.generation import build_generation_model, text_to_text_batches
from folnet.train.finetune.loop import (
    LoopSettings,
    batches,
    finetune_logger,
    finetune_model,
    num_batches,
)
from folnet.train.finetune.warm_start import (
    build_task_model,
    check_vocabulary,
    resolve_checkpoint,
    save_finetuned,
    task_tokenizer,
)
from folnet.train.tasks import TaskSpec

__all__ = ["finetune"]


def _selection_split(task: TaskSpec, config: FinetuneConfig) -> str | None:
    if config.keep != "best":
        return None
    for name in task.eval_splits:
        if name.startswith("validation"):
            return name
    raise FolnetError(f"--keep best chooses the epoch by a validation split, and {task.name} "
                      f"has none (its evaluation splits: {', '.join(task.eval_splits)}); use "
                      f"--keep last")


def _seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def _flat(split_metrics: Mapping[str, Mapping[str, float]]) -> dict[str, float]:
    return {f"eval/{s}/{m}": v for s, metrics in split_metrics.items() for m, v in metrics.items()}


def _run_seed(seed: int, *, config: FinetuneConfig, hyper: Hyper, data: TaskData,
              checkpoint: Path, tokenizer: FolnetTokenizer, out: Path,
              device: torch.device) -> dict[str, Any]:
    """Train and score one seed; its files go to ``OUT/seed_<seed>``."""
    task, train = data.task, data.train
    if train is None:
        raise FolnetError(f"{task.name}: no training split was loaded")
    seed_dir = out / f"seed_{seed}"
    if seed_dir.exists():
        shutil.rmtree(seed_dir)
    _seed_everything(seed)
    order = torch.Generator().manual_seed(seed)
    if task.kind == "generation":
        model = build_generation_model(checkpoint, dropout=hyper.dropout)

        def epoch_batches(_epoch: int) -> Iterator[dict[str, torch.Tensor]]:
            return text_to_text_batches(model.cfg.kind, train.tensors, hyper.batch_size,
                                        pad=tokenizer.pad_id, generator=order)
    else:
        head, num_labels = task_head(task)
        model = build_task_model(checkpoint, head, num_labels, dropout=hyper.dropout)

        def epoch_batches(_epoch: int) -> Iterator[dict[str, torch.Tensor]]:
            return batches(train.tensors, hyper.batch_size, shuffle=True, generator=order,
                           group_by_length=config.group_by_length)
    steps_per_epoch = num_batches(len(train), hyper.batch_size)
    total = config.max_steps or hyper.epochs * steps_per_epoch
    settings = LoopSettings(lr=hyper.lr, weight_decay=hyper.weight_decay, betas=hyper.betas,
                            eps=hyper.adam_eps, warmup_ratio=hyper.warmup_ratio,
                            schedule=config.schedule,
                            clip_norm=config.clip_norm, precision=config.precision,
                            log_every=config.log_every, max_bad_steps=config.max_bad_steps)
    score_args = {"options": run_options(config, hyper), "batch_size": config.eval_batch_size,
                  "device": device, "precision": config.precision}
    select = _selection_split(task, config)
    history: list[dict[str, Any]] = []
    best: dict[str, Any] = {"score": None, "state": None, "epoch": None}
    logger = finetune_logger(seed_dir, total_steps=total, tensorboard=config.tensorboard,
                            progress=config.progress, desc=f"finetune {task.name} seed {seed}")

    def after_epoch(epoch: int, step: int) -> None:
        if not (config.eval_every_epoch or select):
            return
        results = evaluate_splits(model, data, **score_args)
        metrics = {name: m for name, (m, _rows) in results.items()}
        history.append({"epoch": epoch, "step": step, **metrics})
        logger.log({"step": step, "epoch": epoch, **_flat(metrics)})
        if select and metrics[select]:
            score = metrics[select][task.main_metric]
            if best["score"] is None or score > best["score"]:
                best.update(score=score, epoch=epoch,
                            state={k: v.detach().cpu().clone()
                                   for k, v in model.state_dict().items()})

    try:
        summary = finetune_model(
            model, epoch_batches, steps_per_epoch, epochs=hyper.epochs, settings=settings,
            max_steps=config.max_steps, device=device, logger=logger, after_epoch=after_epoch)
        if best["state"] is not None:
            model.load_state_dict(best["state"])
        results = evaluate_splits(model, data, **score_args)
        metrics = {name: m for name, (m, _rows) in results.items()}
        logger.log({"step": summary["steps"], "epoch": summary["epochs"], **_flat(metrics)})
        logger.message(f"seed {seed}: " + "; ".join(
            f"{s} {task.main_metric} {m[task.main_metric]:.4f}"
            for s, m in metrics.items() if task.main_metric in m))
    finally:
        logger.close()
    for name, (_metrics, rows) in results.items():
        write_predictions(seed_dir / "predictions", task, name, rows)
    extra = {"config": config.to_dict(), "hyper": _hyper_dict(hyper), "seed": seed,
             "checkpoint": str(checkpoint), "steps": summary["steps"], "metrics": metrics,
             "best_epoch": best["epoch"]}
    save_finetuned(model.cpu(), seed_dir / "model", tokenizer, task=task.name,
                   labels=label_names(task), extra=extra)
    record = {"seed": seed, "metrics": metrics, "steps": summary["steps"],
              "epochs": summary["epochs"], "best_epoch": best["epoch"], "history": history}
    atomic_write_json(seed_dir / "metrics.json", record)
    return record


def _hyper_dict(hyper: Hyper) -> dict[str, Any]:
    return {**dataclasses.asdict(hyper), "betas": list(hyper.betas)}


def _median(records: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Every metric of every split, median over the seeds' records."""
    out: dict[str, dict[str, float]] = {}
    for split in records[0]["metrics"]:
        names = records[0]["metrics"][split]
        out[split] = {name: float(statistics.median(r["metrics"][split][name] for r in records))
                      for name in names}
    return out


def _check_out(config: FinetuneConfig, out: Path) -> None:
    if (out / "eval.json").exists() and not config.overwrite:
        raise FolnetError(f"--out {str(out)!r} already holds a finetuning run (eval.json); "
                          f"pass --overwrite to replace it or choose another --out")


def finetune(config: FinetuneConfig) -> dict[str, Any]:
    """Run ``config`` (all seeds); returns the ``eval.json`` payload."""
    if config.task is None:
        raise FolnetError("--task is required: glue/<task>, squad2, folio, clutrr, kinship, "
                          "kinship/symbolic, or a task answered by generation (kinship/generate, "
                          "kinship/symbolic/generate, clutrr/generate)")
    task = resolve_task(config.task)
    _selection_split(task, config)  # fail before reading anything
    tune_cpu_allocator(config.hyper(task).max_len)  # long inputs: see `folnet.runtime`
    if config.out is None:
        raise FolnetError("--out is required: the directory for eval.json, predictions and "
                          "the finetuned model")
    out = check_out(config.out, what="finetuning run")  # before anything is written
    lock = RunLock(out, what="finetuning run", on_acquire=remove_leftovers)
    fresh = FreshStart(out)  # a start that fails leaves nothing
    try:
        with write_faults(out), fresh:
            return _finetune(config, task, out, lock, fresh)
    finally:
        lock.release()


def _finetune(config: FinetuneConfig, task: TaskSpec, out: Path, lock: RunLock,
              fresh: FreshStart) -> dict[str, Any]:
    if out.is_dir():
        lock.acquire()  # before reading OUT: no other run may change it now
    _check_out(config, out)
    device = resolve_device(config.device)
    checkpoint = resolve_checkpoint(config.checkpoint, "--from")
    tokenizer = task_tokenizer(checkpoint, config.tokenizer)
    check_vocabulary(read_metadata(checkpoint), tokenizer, f"--from {config.checkpoint!r}")
    hyper = config.hyper(task)
    data = load_run_data(config, tokenizer, hyper)
    task = data.task
    lock.acquire()  # creates OUT, refuses a second run, then clears what killed runs left
    settings = {"config": config.to_dict(), "hyper": _hyper_dict(hyper),
                "checkpoint": str(checkpoint), "task": task.name, "labels": label_names(task)}
    atomic_write_json(out / "run_config.json", settings)
    fresh.begun()
    records = [_run_seed(seed, config=config, hyper=hyper, data=data, checkpoint=checkpoint,
                         tokenizer=tokenizer, out=out, device=device)
               for seed in config.seed_list]

    medians = _median(records)
    splits = list(medians)
    headline = headline_split(task, splits)
    main = task.main_metric
    chosen = records[0]
    if main in medians[headline]:
        target = medians[headline][main]
        chosen = min(records, key=lambda r: (abs(r["metrics"][headline][main] - target),
                                             r["seed"]))
    source = out / f"seed_{chosen['seed']}"
    for name in ("model", "predictions"):
        if (out / name).exists():
            shutil.rmtree(out / name)
        if config.keep_seed_models or name == "predictions":
            shutil.copytree(source / name, out / name)
        else:
            shutil.move(str(source / name), str(out / name))
    if not config.keep_seed_models:
        for record in records:
            shutil.rmtree(out / f"seed_{record['seed']}" / "model", ignore_errors=True)
    payload = {
        **settings, "main_metric": main, "headline_split": headline,
        "headline": medians[headline].get(main), "metrics": medians,
        "seeds": config.seed_list, "chosen_seed": chosen["seed"],
        "per_seed": {str(r["seed"]): r["metrics"] for r in records},
        "history": {str(r["seed"]): r["history"] for r in records if r["history"]},
        "model": "model", "predictions": {s: f"predictions/{s}.tsv" for s in splits},
    }
    write_eval_json(out / "eval.json", payload)
    return payload
