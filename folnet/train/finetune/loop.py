"""The generic finetuning loop and batched prediction, for every task head.

`finetune_model` trains any `FolnetModel` whose forward computes its own loss from the batch
(``labels`` for classification, regression, multiple choice and token classification;
``start_positions``/``end_positions`` for QA): AdamW over `parameter_groups` (biases not
decayed), linear warmup then linear decay, optional gradient clipping, optional autocast. It
knows nothing about tasks, so the Python API can drive it with any batches (see
`folnet.train.finetune.from_python`).

Why batches are trimmed (`trim`): inputs are encoded to the task's full length (128 to 512),
but FOLNet's binary stream costs T^2 and its ``t`` operator T^3, so cutting every batch after its
last real column is the largest speed-up on short-text tasks. Pad positions are removed from
every reduction by the attention mask, so trimming does not change any real token's output.

Every step passes `folnet.train.engine.guard.StepGuard`: a step whose loss or gradient norm is
NaN or inf is skipped (no update; the schedule moves on), counted in the log records
(``skipped``), and ``max_bad_steps`` of them in a row stop the run with `NonFiniteError`. The
weights are checked before every evaluation that may keep them (``after_epoch``) and at the
end, so a caller never saves a model with a NaN or inf weight.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from folnet.errors import FolnetError
from folnet.train.data.padding import trim_padding
from folnet.train.engine.amp import autocast, check_precision, make_grad_scaler
from folnet.train.engine.guard import (
    StepGuard,
    advance_schedule,
    check_finite_weights,
    gradient_norm,
)
from folnet.train.engine.optim import build_optimizer, build_scheduler
from folnet.train.engine.runlog import TrainLogger

__all__ = ["LOG_FIELDS", "LoopSettings", "batches", "finetune_logger", "finetune_model",
           "num_batches", "predict", "trim"]

LOG_FIELDS = ("step", "epoch", "loss", "lr", "grad_norm", "samples_per_s", "tokens_per_s",
              "elapsed", "samples", "skipped")
_PER_TOKEN = ("start_logits", "end_logits")


def log_postfix(record: Mapping[str, Any]) -> str:
    """What the progress bar shows after each logged step."""
    loss = record.get("loss")
    shown = "n/a" if loss is None else f"{loss:.4f}"  # None: every step of the window skipped
    return f"loss {shown} lr {record['lr']:.2e}"


def finetune_logger(out: Any, *, total_steps: int, tensorboard: bool, progress: bool,
                    desc: str = "finetune") -> TrainLogger:
    """The logger of one finetuning run: `TrainLogger` with finetuning's columns, always a
    fresh log (finetuning never resumes mid-run). Evaluation records (``eval/<split>/<metric>``
    keys, no loss) go to the JSONL and TensorBoard only. Without the bar, a line per logged
    step and per evaluation (`TrainLogger`'s ``lines``)."""
    return TrainLogger(out, fields=LOG_FIELDS, tag="finetune", total_steps=total_steps,
                       postfix=log_postfix, desc=desc, tensorboard=tensorboard,
                       progress=progress, lines=not progress)


#: finetuning's name for `folnet.train.data.padding.trim_padding` (the pretraining loop's too)
trim = trim_padding


def batches(tensors: Mapping[str, torch.Tensor], batch_size: int, *, shuffle: bool = False,
            generator: torch.Generator | None = None, drop_last: bool = False,
            group_by_length: bool = False) -> Iterator[dict[str, torch.Tensor]]:
    """Trimmed batches of rows of ``tensors`` (all with the same first dimension).

    ``group_by_length`` (with ``shuffle``) sorts each run of 50 shuffled batches by length
    before cutting it into batches, then shuffles the batches: rows of a batch have similar
    lengths, so trimming removes most padding -- on CPU often a third of the compute -- while
    the order of the data stays random at the scale of a few hundred rows.
    """
    rows = {int(t.shape[0]) for t in tensors.values()}
    if len(rows) != 1:
        raise FolnetError(f"batches: tensors have different row counts {sorted(rows)}")
    n = rows.pop()
    order = torch.randperm(n, generator=generator) if shuffle else torch.arange(n)  # [n]
    stop = n - n % batch_size if drop_last else n
    starts = list(range(0, stop, batch_size))
    if shuffle and group_by_length and "attention_mask" in tensors:
        lengths = tensors["attention_mask"].flatten(1).sum(-1)  # [n] real tokens per row
        span = 50 * batch_size
        order = torch.cat([chunk[torch.argsort(lengths[chunk], descending=True, stable=True)]
                           for chunk in order[:stop].split(span)] + [order[stop:]])
        starts = [starts[i] for i in torch.randperm(len(starts), generator=generator).tolist()]
    for start in starts:
        index = order[start:start + batch_size]
        yield trim_padding({k: v[index] for k, v in tensors.items()})


def num_batches(rows: int, batch_size: int, drop_last: bool = False) -> int:
    """How many batches `batches` cuts ``rows`` rows into."""
    return rows // batch_size if drop_last else -(-rows // batch_size)


@dataclass(frozen=True)
class LoopSettings:
    """Optimiser and schedule of one finetuning run (paper Table 7 by default)."""

    lr: float = 5e-5
    weight_decay: float = 0.01
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-6
    warmup_ratio: float = 0.06
    schedule: str = "linear"
    clip_norm: float = 0.0
    precision: str = "fp32"
    log_every: int = 10
    max_bad_steps: int = 3


def _to(batch: Mapping[str, torch.Tensor], device: torch.device) -> dict[str, torch.Tensor]:
    return {k: v.to(device, non_blocking=True) for k, v in batch.items()}


def _fresh_window() -> dict[str, Any]:
    return {"loss": 0.0, "batches": 0, "rows": 0, "tokens": 0, "lr": None, "norm": None}


def _train_step(model: nn.Module, batch: dict[str, torch.Tensor], optimizer, scheduler, scaler,
                settings: LoopSettings, device: torch.device, window: dict[str, Any],
                guard: StepGuard, step: int) -> str | None:
    """One optimiser step on one batch, or a skipped one when `guard` finds its loss or
    gradient norm not finite (no update); adds an updated step's loss, rows and tokens to
    ``window``. Returns the guard's note of a skipped step (None: updated)."""
    with autocast(settings.precision, device):
        out = model(**batch)
    if out.loss is None:
        raise FolnetError("finetune_model: the batch gave no loss (no labels in it?)")
    scaler.scale(out.loss).backward()
    scaler.unscale_(optimizer)  # a no-op without fp16 loss scaling
    norm = gradient_norm(model, settings.clip_norm)
    loss, window["norm"] = torch.stack([out.loss.detach().float(),
                                        norm.detach().float().to(out.loss.device)]).tolist()
    note = guard.check(step, loss, window["norm"],
                       scaler.get_scale() if scaler.is_enabled() else None)
    window["lr"] = scheduler.get_last_lr()[0]
    if note is None:
        scaler.step(optimizer)
    scaler.update()  # fp16: lowers the scale after an overflow that unscale_ found
    advance_schedule(scheduler, updated=note is None)
    optimizer.zero_grad(set_to_none=True)
    if note is not None:
        return note
    mask = batch.get("attention_mask")
    window["loss"] += loss
    window["batches"] += 1
    window["rows"] += int(batch["input_ids"].shape[0])
    window["tokens"] += int(mask.sum()) if mask is not None else batch["input_ids"].numel()
    return None


def finetune_model(model: nn.Module, train_batches: Callable[[int], Iterable[Mapping[str, Any]]],
                   steps_per_epoch: int, *, epochs: int, settings: LoopSettings,
                   max_steps: int | None = None, device: str | torch.device = "cpu",
                   logger: TrainLogger | None = None,
                   after_epoch: Callable[[int, int], None] | None = None) -> dict[str, Any]:
    """Train ``model`` in place; returns ``{"steps", "epochs", "loss", "skipped"}`` (the last
    logged loss; the count of steps skipped for a NaN or inf loss or gradient norm).

    ``train_batches(epoch)`` yields the batches of one epoch (dicts of model keyword
    arguments, labels included); ``steps_per_epoch`` is their count, so that the schedule can
    be laid out up front. ``max_steps`` stops early (and sets the schedule's length) even in
    the middle of an epoch; ``after_epoch(epoch, step)`` runs after every full epoch (e.g. an
    evaluation) with the model in eval mode and is followed by a return to train mode.
    Raises `NonFiniteError` when ``settings.max_bad_steps`` steps in a row are skipped, or
    when a weight is NaN or inf at the end or before ``after_epoch``.
    """
    device = torch.device(device)
    check_precision(settings.precision, device)
    if steps_per_epoch < 1:
        raise FolnetError("finetune_model: the training data gives no batch (steps_per_epoch 0)")
    total = epochs * steps_per_epoch if max_steps is None else max_steps
    model.to(device).train()
    optimizer = build_optimizer(model, "adamw", lr=settings.lr, weight_decay=settings.weight_decay,
                                betas=settings.betas, eps=settings.eps)
    scheduler = build_scheduler(optimizer, total, warmup_ratio=settings.warmup_ratio,
                                schedule=settings.schedule)
    scaler = make_grad_scaler(settings.precision, device)
    guard = StepGuard(settings.max_bad_steps, what="finetuning", lr=settings.lr)
    step, epoch, samples, last_loss = 0, 0, 0, float("nan")
    window = _fresh_window()
    start = window_start = time.perf_counter()
    while step < total:
        seen = 0
        for batch in train_batches(epoch):
            seen += 1
            note = _train_step(model, _to(batch, device), optimizer, scheduler, scaler,
                               settings, device, window, guard, step + 1)
            step += 1
            if logger is not None:
                if note is not None:
                    logger.message(note)
                logger.advance()
            if step % settings.log_every == 0 or step == total:
                now = time.perf_counter()
                seconds = max(now - window_start, 1e-9)
                # None (NaN in the summary) when every step since the last record was skipped
                last_loss = (window["loss"] / window["batches"] if window["batches"]
                             else float("nan"))
                samples += int(window["rows"])
                if logger is not None:
                    logger.log({"step": step, "epoch": epoch, "loss": last_loss,
                                "lr": window["lr"], "grad_norm": window["norm"],
                                "samples_per_s": window["rows"] / seconds,
                                "tokens_per_s": window["tokens"] / seconds,
                                "elapsed": now - start, "samples": samples,
                                "skipped": guard.skipped})
                window = _fresh_window()
                window_start = now
            if step >= total:
                break
        if seen == 0:
            raise FolnetError(f"finetune_model: epoch {epoch} gave no batches")
        if seen == steps_per_epoch:
            epoch += 1
            if after_epoch is not None:
                check_finite_weights(model, f"the model of epoch {epoch} (step {step})")
                model.eval()
                after_epoch(epoch, step)
                model.train()
    check_finite_weights(model, f"the finetuned model (step {step})")
    model.eval()
    return {"steps": step, "epochs": epoch, "loss": last_loss, "skipped": guard.skipped}


@torch.no_grad()
def predict(model: nn.Module, eval_batches: Iterable[Mapping[str, torch.Tensor]], *,
            device: str | torch.device = "cpu", precision: str = "fp32",
            full_length: int | None = None) -> dict[str, torch.Tensor]:
    """The head's outputs over all batches, concatenated on the CPU in float32.

    Returns ``logits`` (and ``start_logits``/``end_logits`` for QA). Per-token outputs of
    trimmed batches are padded back to ``full_length`` with -inf, so that row i always has the
    width of the encoded inputs (SQuAD's offset mappings index it).
    """
    device = torch.device(device)
    model.to(device).eval()
    found: dict[str, list[torch.Tensor]] = {}
    for batch in eval_batches:
        batch = _to({k: v for k, v in batch.items() if k not in
                     ("labels", "start_positions", "end_positions")}, device)
        with autocast(precision, device):
            out = model(**batch)
        names = ("start_logits", "end_logits") if out.start_logits is not None else ("logits",)
        for name in names:
            value = getattr(out, name).float().cpu()
            per_token = name in _PER_TOKEN or (value.ndim == 3 and model.head ==
                                               "token-classification")
            if per_token and full_length is not None and value.shape[1] < full_length:
                pad_shape = (value.shape[0], full_length - value.shape[1], *value.shape[2:])
                value = torch.cat([value, value.new_full(pad_shape, float("-inf"))], dim=1)
            found.setdefault(name, []).append(value)
    if not found:
        raise FolnetError("predict got no batches")
    return {name: torch.cat(parts) for name, parts in found.items()}
