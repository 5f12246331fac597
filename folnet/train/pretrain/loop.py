"""The pretraining loop: tokenizer -> dataset -> model -> LAMB/AdamW -> steps -> checkpoints.

`pretrain(config)` is what ``folnet pretrain`` (and ``torchrun ... -m folnet.train.pretrain``)
runs. One optimiser step consumes ``batch_size`` sequences: ``grad_accum`` global
micro-batches, each split evenly over the processes (see `folnet.train.engine.distributed`).

Why the loss is normalised by the *global* counts: the MLM loss of a step is the mean over
every masked token of the whole global batch and the NSP/SOP loss the mean over its sequences.
Each micro-batch contributes ``sum / global count`` (times the world size, which DDP's gradient
averaging divides out again), so the gradient is the same whatever ``grad_accum`` and the
number of processes are: two processes reproduce one, and a resumed run reproduces an
uninterrupted one bit for bit.

Every step is judged by `folnet.train.engine.guard.StepGuard` from its global loss and gradient
norm (one small transfer per step): a non-finite one is skipped -- no update, its losses kept
out of the logged means, the count in every log record (``skipped``) -- and ``--max-bad-steps``
of them in a row stop the run with exit status 1. The counts travel in the trainer state, so a
resumed run judges as the uninterrupted one would.

The run reads in three parts: set-up (`folnet.train.pretrain.setup_run.set_up`, which hands
the loop one `Run`), the step loop (`_run_steps`: one step is `_accumulate` then
`_optimizer_step`) and the finish (`_finish`); `_train` holds them together with the failure
handling. A step's sums travel by name (`folnet.train.pretrain.metrics.StepMetrics`), packed
into one tensor for the all-reduce.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from folnet.atomic_write import write_faults
from folnet.errors import FolnetError, Interrupted
from folnet.runtime import (
    deterministic_algorithms,
    release_free_memory,
    resident_bytes,
    tune_cpu_allocator,
)
from folnet.train.data.padding import trim_padding
from folnet.train.engine import step_checkpoints as ckpt
from folnet.train.engine.amp import autocast
from folnet.train.engine.distributed import (
    DistContext,
    all_reduce_sum,
    barrier,
    gradient_sync,
    init_distributed,
    shard_slice,
    shutdown,
)
from folnet.train.engine.guard import StepGuard, advance_schedule, gradient_norm
from folnet.train.engine.lock import RunLock
from folnet.train.engine.memory import allocation_failure
from folnet.train.engine.outdir import FreshStart, check_out
from folnet.train.engine.state import publish_final, save_training_checkpoint, write_model_fn
from folnet.train.pretrain.config import PretrainConfig
from folnet.train.pretrain.inputs import micro_batches
from folnet.train.pretrain.metrics import LOG_FIELDS, StepMetrics, log_record
from folnet.train.pretrain.setup_run import PretrainingForward, Run, set_up

__all__ = ["LOG_FIELDS", "PretrainingForward", "pretrain", "train_step"]


def pretrain(config: PretrainConfig) -> Path:
    """Run (or resume) pretraining; returns ``OUT/final`` (model + tokenizer)."""
    if config.out is None:
        raise FolnetError("--out is required: the run directory for checkpoints and logs")
    out = check_out(config.out, what="pretraining run")  # before anything is written
    config.register_operators()  # --operators, before anything reads --ops
    # a training process: keep tensors on the heap (2x on CPU), the large ones of long
    # sequences excepted (`folnet.runtime`)
    tune_cpu_allocator(config.seq_len)
    ctx = init_distributed(config.device)
    deterministic = (torch.are_deterministic_algorithms_enabled(),
                     torch.is_deterministic_algorithms_warn_only_enabled())
    # one run per OUT (rank 0 holds it); a full disk or read-only OUT is one line naming a file
    lock = RunLock(out, what="pretraining run", enabled=ctx.is_main,
                   on_acquire=ckpt.remove_stale_temporaries)
    start = FreshStart(out, enabled=ctx.is_main)  # a failed start leaves nothing
    finished = False
    try:
        with write_faults(out), start:
            final = _train(config, ctx, lock, start)
        finished = True
        return final
    finally:
        lock.release()
        deterministic_algorithms(*deterministic)  # leave the caller's setting be
        shutdown(ctx, finished=finished)


# -- the steps ---------------------------------------------------------------------------------


def _accumulate(engine: nn.Module, micro: list[dict[str, torch.Tensor]], config: PretrainConfig,
                ctx: DistContext, scaler: torch.amp.GradScaler, rows: slice,
                sums: torch.Tensor) -> None:
    """Forward and backward over one step's micro-batches; add their `StepMetrics` to
    ``sums`` (packed)."""
    n_masked = max(1, sum(int((b["mlm_labels"] != -100).sum()) for b in micro))
    for i, batch in enumerate(micro):
        # this rank's rows: [b, T] inputs and labels, [b] nsp_labels; T cut to the last
        # column with a real token (--trim-padding), on the CPU before the copy
        here = {k: v[rows] for k, v in batch.items()}
        if config.trim_padding:
            here = trim_padding(here)
        local = {k: v.to(ctx.device, non_blocking=True) for k, v in here.items()}
        # a batch without padding goes without a mask (the unmasked path measured ~3%
        # faster); decided on the CPU copy, where reading it costs no device sync
        mask = None if bool(here["attention_mask"].all()) else local["attention_mask"]
        with gradient_sync(engine, i == len(micro) - 1):
            with autocast(config.precision, ctx.device):
                mlm_logits, mlm_labels, nsp_logits = engine(
                    local["input_ids"], local["token_type_ids"], mask, local["mlm_labels"])
            mlm_logits, nsp_logits = mlm_logits.float(), nsp_logits.float()  # (N, V), (b, 2)
            mlm_sum = F.cross_entropy(mlm_logits, mlm_labels, reduction="sum")
            nsp_sum = F.cross_entropy(nsp_logits, local["nsp_labels"], reduction="sum")
            loss = (mlm_sum / n_masked + nsp_sum / config.batch_size) * ctx.world_size
            scaler.scale(loss).backward()
        with torch.no_grad():
            sums += StepMetrics(
                mlm_loss_sum=mlm_sum, nsp_loss_sum=nsp_sum,
                mlm_correct=(mlm_logits.argmax(-1) == mlm_labels).sum(),
                nsp_correct=(nsp_logits.argmax(-1) == local["nsp_labels"]).sum(),
                mlm_targets=mlm_labels.numel(), sequences=nsp_logits.shape[0]).pack(sums.device)


def _optimizer_step(run: Run, guard: StepGuard, step: int, sums: torch.Tensor
                    ) -> tuple[float, str | None]:
    """Unscale, measure (and clip) the gradient norm, let `guard` judge the step by its global
    loss (from this step's ``sums``) and the norm, then update or skip; the schedule advances
    either way. Returns the norm and the guard's note of a skipped step (None: updated)."""
    scaler = run.scaler
    scaler.unscale_(run.optimizer)  # a no-op without fp16 loss scaling
    norm = gradient_norm(run.model, run.config.clip_norm)
    totals = all_reduce_sum(sums.clone(), run.ctx)  # this step's sums over all ranks
    *values, grad_norm = torch.cat([totals, norm.detach().reshape(1).to(totals)]).tolist()
    loss = StepMetrics.unpack(values).loss  # one transfer for the sums and the norm
    note = guard.check(step, loss, grad_norm, scaler.get_scale() if scaler.is_enabled() else None)
    if note is None:
        scaler.step(run.optimizer)
    scaler.update()  # fp16: lowers the scale after an overflow that unscale_ found
    advance_schedule(run.scheduler, updated=note is None)
    run.optimizer.zero_grad(set_to_none=True)
    return grad_norm, note


def train_step(run: Run, micro: list[dict[str, torch.Tensor]], guard: StepGuard, step: int,
               rows: slice) -> tuple[torch.Tensor, float, str | None]:
    """One optimiser step on the masked micro-batches ``micro`` (this rank's ``rows`` of
    each): forward and backward over them, then the update the guard allows. Returns the
    step's packed `StepMetrics`, its gradient norm and the guard's note of a skipped step."""
    sums = StepMetrics.zeros(run.ctx.device)  # this step's
    _accumulate(run.engine, micro, run.config, run.ctx, run.scaler, rows, sums)
    grad_norm, skipped = _optimizer_step(run, guard, step, sums)
    return sums, grad_norm, skipped


class _LogWindow:
    """The updated steps since the last log record: their packed `StepMetrics`, the tokens
    read and when the window opened."""

    def __init__(self, device: torch.device) -> None:
        self.sums = StepMetrics.zeros(device)
        self.tokens, self.start = 0, time.perf_counter()

    def record(self, run: Run, *, step: int, lr: float, grad_norm: float, run_start: float
               ) -> dict[str, Any]:
        """The log record over all processes, then the window starts afresh."""
        now = time.perf_counter()
        totals = StepMetrics.unpack(all_reduce_sum(self.sums.clone(), run.ctx).tolist())
        record = log_record(totals, step=step, lr=lr, grad_norm=grad_norm, tokens=self.tokens,
                            seconds=max(now - self.start, 1e-9), elapsed=now - run_start,
                            state=run.state)
        self.sums.zero_()
        self.tokens, self.start = 0, now
        return record


def _save(run: Run, step: int) -> None:
    save_training_checkpoint(
        run.out, model=run.model, engine=run.engine, optimizer=run.optimizer,
        scheduler=run.scheduler, scaler=run.scaler, collator=run.collator,
        tokenizer=run.tokenizer, ctx=run.ctx, state=run.state,
        extra={"pretrain": run.config.to_dict(), "step": step}, keep_last=run.config.keep_last,
        fsdp=run.config.fsdp)


def _run_steps(run: Run) -> None:
    """The optimiser steps from the run's step to ``--steps``, each logged every
    ``--log-every`` and checkpointed every ``--save-every`` steps (and both at the last)."""
    config, state = run.config, run.state
    batches = micro_batches(run.dataset, run.collator, config, (state["epoch"], state["block"]))
    rows = shard_slice(config.micro_batch, run.ctx)
    guard = StepGuard(config.max_bad_steps, what="pretraining", lr=config.lr,
                      skipped=state["skipped"], in_a_row=state["bad_in_a_row"])
    window = _LogWindow(run.ctx.device)
    run_start = time.perf_counter() - state["elapsed"]
    while state["step"] < config.steps:
        micro = []  # mask every micro-batch first: the loss needs the step's target count
        for _ in range(config.grad_accum):
            epoch, block, batch = next(batches)
            micro.append(run.collator.apply_mask(batch))
        step, lr = state["step"] + 1, run.scheduler.get_last_lr()[0]
        sums, grad_norm, skipped = train_step(run, micro, guard, step, rows)
        if run.trim_above is not None and (resident_bytes() or 0) > run.trim_above:
            release_free_memory()
        if skipped is None:
            window.sums += sums
        else:
            run.logger.message(skipped)
        tokens = sum(int(b["attention_mask"].sum()) for b in micro)
        state.update(step=step, epoch=epoch, block=block + 1,
                     samples=state["samples"] + config.batch_size,
                     tokens=state["tokens"] + tokens, skipped=guard.skipped,
                     bad_in_a_row=guard.in_a_row)
        window.tokens += tokens
        run.logger.advance()
        if step % config.log_every == 0 or step == config.steps:
            run.logger.log(window.record(run, step=step, lr=lr, grad_norm=grad_norm,
                                         run_start=run_start))
        if step % config.save_every == 0 or step == config.steps:
            state["elapsed"] = time.perf_counter() - run_start
            _save(run, step)


# -- the end ------------------------------------------------------------------------------------


def _finish(run: Run) -> Path:
    """Publish ``OUT/final`` (model and tokenizer) once every process is done."""
    write = write_model_fn(run.model, run.engine, {"pretrain": run.config.to_dict(),
                                                   "step": run.state["step"]},
                           run.config.fsdp, run.ctx.is_main, what="the final model")
    final = run.out / "final"
    if run.ctx.is_main:
        publish_final(run.out, write, run.tokenizer)
    barrier(run.ctx)
    run.logger.message(f"done: {run.state['step']} steps; final model and tokenizer in {final}")
    return final


def _train(config: PretrainConfig, ctx: DistContext, lock: RunLock, fresh: FreshStart) -> Path:
    """Set up, run the steps, finish. From the first step on a failure keeps the run's files
    (its log, its checkpoints); Ctrl-C and an allocation that fails are one line each."""
    run = set_up(config, ctx, lock)
    fresh.begun()
    try:
        _run_steps(run)
        return _finish(run)
    except KeyboardInterrupt:
        raise Interrupted(_interrupted(run.out, run.state["step"], run.config.steps)) from None
    except RuntimeError as exc:  # torch.OutOfMemoryError is one
        failure = allocation_failure(exc, step=run.state["step"] + 1, fit=run.fit)
        if failure is None:
            raise
        raise failure from None
    finally:
        run.logger.close()


def _interrupted(out: Path, step: int, steps: int) -> str:
    """What Ctrl-C at ``step`` leaves and what to run to go on."""
    saved = ckpt.list_checkpoints(out)
    if not saved:
        return (f"interrupted at step {step} of {steps}, before the first checkpoint "
                f"(--save-every); the same command starts over")
    return (f"interrupted at step {step} of {steps}; the last checkpoint is step "
            f"{saved[-1][0]} in {str(out)!r}: resume with the same command and --resume")

