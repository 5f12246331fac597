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

Every step is judged from its global loss and gradient norm: a non-finite one is skipped -- no
update, its losses kept out of the logged means, the count in every log record (``skipped``)
-- and ``--max-bad-steps`` of them in a row stop the run with exit status 1. No step waits for
the device to judge it (docs/design.md section 14): the optimiser skips a bad step on the
device (`folnet.train.engine.optim.step_unless`), and the host reads the step's loss and norm
one step later for `folnet.train.engine.guard.StepGuard`'s counts and notes. The counts travel
in the trainer state, so a resumed run judges as the uninterrupted one would.

The run reads in three parts: set-up (`folnet.train.pretrain.setup_run.set_up`, which hands
the loop one `Run`), the step loop (`_run_steps`: one step is `train_step`, `_accumulate` then
`_optimizer_step`) and the finish (`_finish`); `_train` holds them together with the failure
handling. A step's sums travel by name (`folnet.train.pretrain.metrics.StepMetrics`), packed
into one tensor for the all-reduce.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
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
    to_device,
)
from folnet.train.engine.guard import StepGuard, advance_schedule, gradient_norm
from folnet.train.engine.lock import RunLock
from folnet.train.engine.memory_budget import allocation_failure
from folnet.train.engine.optim import step_unless
from folnet.train.engine.outdir import FreshStart, check_out
from folnet.train.engine.peers import lost_peer
from folnet.train.engine.state import publish_final, save_training_checkpoint, write_model_fn
from folnet.train.pretrain.config import PretrainConfig
from folnet.train.pretrain.heldout import measure_heldout
from folnet.train.pretrain.inputs import micro_batches
from folnet.train.pretrain.metrics import LOG_FIELDS, StepMetrics, log_record
from folnet.train.pretrain.objectives import engine_inputs, token_targets
from folnet.train.pretrain.setup_run import PretrainingForward, Run, set_up

__all__ = ["LOG_FIELDS", "PretrainingForward", "Verdict", "pretrain", "train_step"]


def pretrain(config: PretrainConfig) -> Path:
    """Run (or resume) pretraining; returns ``OUT/final`` (model + tokenizer)."""
    if config.out is None:
        raise FolnetError("--out is required: the run directory for checkpoints and logs")
    out = check_out(config.out, what="pretraining run")  # before anything is written
    config.register_operators()  # --operators, before anything reads --ops
    # a training process: keep tensors on the heap, the large ones of long sequences excepted
    # (`folnet.runtime` says why)
    tune_cpu_allocator(config.seq_len)
    ctx = init_distributed(config.device, group=config.fsdp)
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
    except RuntimeError as exc:  # a peer died: one line, not the collective's traceback
        if ctx.is_distributed and (lost := lost_peer(exc, ctx.rank)) is not None:
            raise lost from None
        raise
    finally:
        lock.release()
        deterministic_algorithms(*deterministic)  # leave the caller's setting be
        shutdown(ctx, finished=finished)


# -- the steps ---------------------------------------------------------------------------------


def _accumulate(engine: nn.Module, micro: list[dict[str, torch.Tensor]], config: PretrainConfig,
                ctx: DistContext, scaler: torch.amp.GradScaler, rows: slice,
                sums: torch.Tensor) -> None:
    """Forward and backward over one step's micro-batches; add their `StepMetrics` to
    ``sums`` (packed). Nothing here reads the device: the target count, the padding and the
    token count come from the host's own copy of the batch."""
    n_targets = token_targets(config.kind, micro)
    for i, batch in enumerate(micro):
        # this rank's rows: [b, T] inputs and labels, [b] nsp_labels (an encoder's); T cut to
        # the last column with a real token (--trim-padding), on the CPU before the copy
        here = {k: v[rows] for k, v in batch.items()}
        # compiled: one shape, one graph; an encoder-decoder's targets have their own width
        if config.trim_padding and not config.compile and config.kind != "encoder-decoder":
            here = trim_padding(here)
        # a batch without padding goes without a mask (the unmasked path is faster,
        # docs/results/measurements.md); decided on the CPU copy, where reading it costs no
        # device sync
        unpadded = bool(here["attention_mask"].all())
        local = to_device(here, ctx.device)
        mask = None if unpadded else local["attention_mask"]
        with gradient_sync(engine, i == len(micro) - 1):
            with autocast(config.precision, ctx.device):
                token_sum, sequence_sum, token_correct, sequence_correct, targets = engine(
                    *engine_inputs(config.kind, local, mask))
            loss = (token_sum / n_targets + sequence_sum / config.batch_size) * ctx.world_size
            scaler.scale(loss).backward()
        with torch.no_grad():
            sums += StepMetrics(
                token_loss_sum=token_sum, sequence_loss_sum=sequence_sum,
                token_correct=token_correct, sequence_correct=sequence_correct,
                targets=targets, sequences=here["input_ids"].shape[0]).pack(sums.device)


@dataclass
class Verdict:
    """One optimiser step's outcome: its sums and gradient norm on the device, judged by the
    host when it reads them (`_settle`) -- one step later, so that reading never waits for a
    queue that holds only this step -- or already on the host (``note``, ``grad_norm``) by
    an optimiser that cannot skip a step on the device."""

    step: int
    sums: torch.Tensor  # this rank's packed `StepMetrics` (added to the log window unless bad)
    totals: torch.Tensor  # over all ranks: the loss the step is judged by
    norm: torch.Tensor  # () the global gradient norm
    bad: torch.Tensor  # () bool: the step was skipped on the device
    scale: torch.Tensor | None  # () the fp16 loss scale it ran at
    settled: bool = False
    grad_norm: float | None = None
    note: str | None = None


def _optimizer_step(run: Run, guard: StepGuard, step: int, sums: torch.Tensor) -> Verdict:
    """Unscale, measure (and clip) the gradient norm, judge the step by its global loss (from
    this step's ``sums``) and the norm, then update or skip; the schedule advances either way.
    The judgement is made on the device where the optimiser can skip there
    (`folnet.train.engine.optim.step_unless`: no host sync), else on the host at once."""
    scaler = run.scaler
    scaler.unscale_(run.optimizer)  # a no-op without fp16 loss scaling
    norm = gradient_norm(run.model, run.config.clip_norm).detach()
    totals = all_reduce_sum(sums.clone(), run.ctx)  # this step's sums over all ranks
    loss = StepMetrics.loss_of(totals)  # () on the device
    bad = ~(torch.isfinite(loss) & torch.isfinite(norm))
    scale = scaler._scale.detach().clone() if scaler.is_enabled() else None
    verdict = Verdict(step, sums, totals, norm, bad, scale)
    if not step_unless(run.optimizer, bad):  # the host judges now: one read
        _settle(run, guard, verdict)
        if verdict.note is None:
            scaler.step(run.optimizer)
    scaler.update()  # fp16: lowers the scale after an overflow that unscale_ found
    advance_schedule(run.scheduler, updated=verdict.note is None)
    run.optimizer.zero_grad(set_to_none=True)
    return verdict


def _settle(run: Run, guard: StepGuard, verdict: Verdict) -> None:
    """Read a step's loss, norm (and fp16 scale) on the host -- one transfer -- and let the
    guard judge it: a skipped step's note goes to the log; `NonFiniteError` after
    ``--max-bad-steps`` in a row."""
    if verdict.settled:
        return
    totals = verdict.totals
    parts = [totals, verdict.norm.reshape(1).to(totals)]
    if verdict.scale is not None:
        parts.append(verdict.scale.reshape(1).to(totals))
    values = torch.cat(parts).tolist()
    n = len(totals)
    scale = values[n + 1] if verdict.scale is not None else None
    verdict.settled, verdict.grad_norm = True, values[n]
    verdict.note = guard.check(verdict.step, StepMetrics.unpack(values[:n]).loss, values[n],
                               scale)
    if verdict.note is not None:
        run.logger.message(verdict.note)


def train_step(run: Run, micro: list[dict[str, torch.Tensor]], guard: StepGuard, step: int,
               rows: slice) -> Verdict:
    """One optimiser step on the masked micro-batches ``micro`` (this rank's ``rows`` of
    each): forward and backward over them, then the update the guard allows -- queued, not
    waited for: the returned `Verdict` is read later (`_settle`)."""
    sums = StepMetrics.zeros(run.ctx.device)  # this step's
    _accumulate(run.engine, micro, run.config, run.ctx, run.scaler, rows, sums)
    return _optimizer_step(run, guard, step, sums)


class _LogWindow:
    """The updated steps since the last log record: their packed `StepMetrics` (a skipped
    step's masked out on the device), the tokens read and when the window opened."""

    def __init__(self, device: torch.device) -> None:
        self.sums = StepMetrics.zeros(device)
        self.tokens, self.start = 0, time.perf_counter()

    def add(self, verdict: Verdict) -> None:
        self.sums += torch.where(verdict.bad, 0.0, verdict.sums)

    def record(self, run: Run, *, step: int, lr: float, grad_norm: float | None,
               run_start: float) -> dict[str, Any]:
        """The log record over all processes, then the window starts afresh."""
        now = time.perf_counter()
        totals = StepMetrics.unpack(all_reduce_sum(self.sums.clone(), run.ctx).tolist())
        record = log_record(totals, step=step, lr=lr, grad_norm=grad_norm, tokens=self.tokens,
                            seconds=max(now - self.start, 1e-9), elapsed=now - run_start,
                            state=run.state, objective=run.config.objective)
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
    ``--log-every`` and checkpointed every ``--save-every`` steps (and both at the last).

    No step waits for the device: each step's verdict is read (`_settle`) after the next
    step's work is queued, and before every log record and checkpoint, so the counts a
    checkpoint holds are its steps' own. A run stopped by the guard has queued one step more
    than the one it names (skipped on the device if it was bad too)."""
    config, state = run.config, run.state
    batches = micro_batches(run.dataset, run.collator, config, (state["epoch"], state["block"]))
    rows = shard_slice(config.micro_batch, run.ctx)
    guard = StepGuard(config.max_bad_steps, what="pretraining", lr=config.lr,
                      skipped=state["skipped"], in_a_row=state["bad_in_a_row"])
    window = _LogWindow(run.ctx.device)
    run_start = time.perf_counter() - state["elapsed"]
    pending: Verdict | None = None  # the last step's, not read yet

    def settle(verdict: Verdict | None) -> None:
        if verdict is not None:
            _settle(run, guard, verdict)
            state.update(skipped=guard.skipped, bad_in_a_row=guard.in_a_row)

    while state["step"] < config.steps:
        micro = []  # mask every micro-batch first: the loss needs the step's target count
        for _ in range(config.grad_accum):
            epoch, block, batch = next(batches)
            micro.append(run.collator.apply_mask(batch))
        step, lr = state["step"] + 1, run.scheduler.get_last_lr()[0]
        verdict = train_step(run, micro, guard, step, rows)
        settle(pending)  # the step before this one: done by now, or nearly
        pending = verdict
        window.add(verdict)
        if run.trim_above is not None and (resident_bytes() or 0) > run.trim_above:
            release_free_memory()
        tokens = sum(int(b["attention_mask"].sum()) for b in micro)
        state.update(step=step, epoch=epoch, block=block + 1,
                     samples=state["samples"] + config.batch_size,
                     tokens=state["tokens"] + tokens)
        window.tokens += tokens
        run.logger.advance()
        logs = step % config.log_every == 0 or step == config.steps
        saves = step % config.save_every == 0 or step == config.steps
        if logs or saves:
            settle(verdict)
        if logs:
            run.logger.log(window.record(run, step=step, lr=lr, grad_norm=verdict.grad_norm,
                                         run_start=run_start))
        if saves:
            measure_heldout(run, step)
            state["elapsed"] = time.perf_counter() - run_start
            _save(run, step)
    settle(pending)


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

