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
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.optim import Optimizer
from torch.optim.lr_scheduler import LRScheduler

from folnet.arch import build_model
from folnet.atomic_write import atomic_write_json, write_faults
from folnet.errors import FolnetError, Interrupted
from folnet.runtime import release_free_memory, resident_bytes, tune_cpu_allocator
from folnet.train.data.masking import PretrainingCollator
from folnet.train.engine import step_checkpoints as ckpt
from folnet.train.engine.amp import autocast, check_precision, make_grad_scaler
from folnet.train.engine.distributed import (
    DistContext,
    all_reduce_sum,
    barrier,
    gradient_sync,
    init_distributed,
    shard_slice,
    shutdown,
    wrap_model,
)
from folnet.train.engine.guard import StepGuard, advance_schedule, gradient_norm
from folnet.train.engine.lock import RunLock
from folnet.train.engine.memory import allocation_failure
from folnet.train.engine.optim import build_optimizer, build_scheduler, reschedule, schedule_rule
from folnet.train.engine.outdir import FreshStart, check_out
from folnet.train.engine.runlog import TrainLogger
from folnet.train.engine.state import (
    publish_final,
    restore_training_state,
    save_training_checkpoint,
    write_model_fn,
)
from folnet.train.pretrain.config import PretrainConfig
from folnet.train.pretrain.fit import fit_pretraining_batch
from folnet.train.pretrain.inputs import check_inputs, micro_batches, run_dataset, run_tokenizer
from folnet.train.pretrain.start import load_initial_weights, plan_start

__all__ = ["LOG_FIELDS", "PretrainingForward", "pretrain"]

#: The columns of ``OUT/log.csv``.
LOG_FIELDS = ("step", "loss", "mlm_loss", "nsp_loss", "mlm_acc", "nsp_acc", "lr", "grad_norm",
              "tokens_per_s", "samples_per_s", "elapsed", "epoch", "samples", "tokens", "skipped")


class PretrainingForward(nn.Module):
    """``(mlm_logits (N, V), mlm_labels (N,), nsp_logits (B, 2))`` of a FolnetModel whose
    ``gather_mlm`` is on; N is the number of masked positions in the batch.

    This is the module DDP/FSDP wrap, and it returns only the tensors the loss reads. Why:
    FOLNet's last layer writes a final binary stream that no pretraining head reads, so the
    parameters of its binary-output operators get no gradient. DDP's unused-parameter search
    walks back from the forward's outputs; were the relation output among them, those
    parameters would look used and DDP would wait for their gradients forever.
    """

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor,
                attention_mask: torch.Tensor | None, mlm_labels: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        out = self.model(input_ids, token_type_ids, attention_mask, mlm_labels=mlm_labels)
        return out.mlm_logits, out.mlm_labels, out.nsp_logits


def _bar_postfix(objective: str) -> Callable[[Mapping[str, Any]], str]:
    """What the progress bar shows after each logged step."""
    def render(record: Mapping[str, Any]) -> str:
        def num(key: str) -> float:
            value = record.get(key)
            return float(value) if isinstance(value, (int, float)) else float("nan")

        return (f"loss {num('loss'):.3f} mlm_acc {num('mlm_acc'):.3f} {objective}_acc "
                f"{num('nsp_acc'):.3f} tok/s {num('tokens_per_s'):,.0f}")

    return render


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
    deterministic = torch.are_deterministic_algorithms_enabled()
    # one run per OUT (rank 0 holds it); a full disk or read-only OUT is one line naming a file
    lock = RunLock(out, what="pretraining run", enabled=ctx.is_main,
                   on_acquire=ckpt.remove_stale_temporaries)
    start = FreshStart(out, enabled=ctx.is_main)  # a failed start leaves nothing
    try:
        with write_faults(out), start:
            return _train(config, ctx, lock, start)
    finally:
        lock.release()
        torch.use_deterministic_algorithms(deterministic)  # leave the caller's setting be
        shutdown(ctx)


# -- the loop ----------------------------------------------------------------------------------


def _accumulate(engine: nn.Module, micro: list[dict[str, torch.Tensor]], config: PretrainConfig,
                ctx: DistContext, scaler: torch.amp.GradScaler, rows: slice,
                window: torch.Tensor) -> None:
    """Forward and backward over one step's micro-batches; add loss and accuracy sums to
    `window` = [mlm loss sum, nsp loss sum, mlm correct, nsp correct, mlm targets, sequences]."""
    n_masked = max(1, sum(int((b["mlm_labels"] != -100).sum()) for b in micro))
    for i, batch in enumerate(micro):
        # this rank's rows: [b, T] inputs and labels, [b] nsp_labels
        local = {k: v[rows].to(ctx.device, non_blocking=True) for k, v in batch.items()}
        # a batch without padding goes without a mask (the unmasked path measured ~3%
        # faster); decided on the CPU copy, where reading it costs no device sync
        mask = None if bool(batch["attention_mask"][rows].all()) else local["attention_mask"]
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
            window += torch.stack([
                mlm_sum.double(), nsp_sum.double(),
                (mlm_logits.argmax(-1) == mlm_labels).sum().double(),
                (nsp_logits.argmax(-1) == local["nsp_labels"]).sum().double(),
                torch.tensor(float(mlm_labels.numel()), device=window.device).double(),
                torch.tensor(float(nsp_logits.shape[0]), device=window.device).double()])


def _optimizer_step(model: nn.Module, optimizer: Optimizer, scheduler: LRScheduler,
                    scaler: torch.amp.GradScaler, config: PretrainConfig, ctx: DistContext,
                    guard: StepGuard, step: int, sums: torch.Tensor) -> tuple[float, str | None]:
    """Unscale, measure (and clip) the gradient norm, let `guard` judge the step by its global
    loss (from this step's `sums`) and the norm, then update or skip; the schedule advances
    either way. Returns the norm and the guard's note of a skipped step (None: updated)."""
    scaler.unscale_(optimizer)  # a no-op without fp16 loss scaling
    norm = gradient_norm(model, config.clip_norm)
    totals = all_reduce_sum(sums.clone(), ctx)  # [6] this step's sums over all ranks
    values = torch.cat([totals, norm.detach().reshape(1).to(totals)]).tolist()
    loss = values[0] / max(values[4], 1.0) + values[1] / max(values[5], 1.0)
    note = guard.check(step, loss, values[6], scaler.get_scale() if scaler.is_enabled() else None)
    if note is None:
        scaler.step(optimizer)
    scaler.update()  # fp16: lowers the scale after an overflow that unscale_ found
    advance_schedule(scheduler, updated=note is None)
    optimizer.zero_grad(set_to_none=True)
    return values[6], note


def _record(window: list[float], *, step: int, lr: float, grad_norm: float | None,
            tokens: int, seconds: float, elapsed: float, state: dict[str, Any]) -> dict:
    """One log record; the losses and accuracies are None when every step since the last
    record was skipped (``window`` holds the sums of updated steps only)."""
    masked, sequences = max(window[4], 1.0), max(window[5], 1.0)
    mlm_loss, nsp_loss = window[0] / masked, window[1] / sequences
    mlm_acc, nsp_acc = window[2] / masked, window[3] / sequences
    if window[5] == 0:
        mlm_loss = nsp_loss = mlm_acc = nsp_acc = None
    return {"step": step, "loss": None if mlm_loss is None else mlm_loss + nsp_loss,
            "mlm_loss": mlm_loss, "nsp_loss": nsp_loss, "mlm_acc": mlm_acc, "nsp_acc": nsp_acc,
            "lr": lr, "grad_norm": grad_norm, "tokens_per_s": tokens / seconds,
            "samples_per_s": window[5] / seconds, "elapsed": elapsed, "epoch": state["epoch"],
            "samples": state["samples"], "tokens": state["tokens"], "skipped": state["skipped"]}


def _train(config: PretrainConfig, ctx: DistContext, lock: RunLock, fresh: FreshStart) -> Path:
    check_precision(config.precision, ctx.device)
    torch.use_deterministic_algorithms(config.deterministic)
    out = Path(config.out)
    if config.micro_batch % ctx.world_size:
        raise FolnetError(f"--batch-size {config.batch_size} / --grad-accum {config.grad_accum} "
                          f"= {config.micro_batch} rows per micro-batch cannot be split over "
                          f"{ctx.world_size} processes")
    if out.is_dir():
        lock.acquire()  # before reading OUT's checkpoints: no other run may change them now
    start = plan_start(config, out)  # checks resume/init-from options; writes nothing
    config, resume = start.config, start.resume
    check_inputs(config, start.tokenizer_from)  # before OUT exists: a failure leaves nothing
    lock.acquire()  # creates OUT, refuses a second run, then clears what killed runs left
    if ctx.is_main:
        atomic_write_json(out / "run_config.json", config.to_dict())
    random.seed(config.seed)
    np.random.seed(config.seed)
    torch.manual_seed(config.seed)

    tokenizer = run_tokenizer(config, out, start.tokenizer_from, ctx)
    if ctx.is_main and (start.tokenizer_from is not None or config.tokenizer is not None):
        tokenizer.save(out / "tokenizer")  # a trained one is there already: other ranks read it
    dataset, data_config = run_dataset(config, tokenizer, out, ctx)
    collator = PretrainingCollator.from_config(tokenizer, data_config)
    fitted, fit = fit_pretraining_batch(config, tokenizer.vocab_size, ctx.device,
                                        ctx.world_size)
    if resume is None:  # a resumed run keeps its recorded micro-batches (its data order)
        config = fitted
        if fit.message is not None and ctx.is_main:
            atomic_write_json(out / "run_config.json", config.to_dict())
    # on a CPU, a heap grown past the budget by fragmentation is trimmed between steps
    trim_above = fit.budget if ctx.device.type == "cpu" else None
    model = build_model(config.ops, preset=config.preset, head="pretraining",
                        vocab_size=tokenizer.vocab_size, **config.model_overrides)
    model.gather_mlm = True  # MLM logits only at the predicted positions
    model.relations = False  # the losses never read the final binary stream
    model.set_activation_checkpointing(config.activation_checkpointing)
    state: dict[str, Any] = {"step": 0, "epoch": 0, "block": 0, "samples": 0, "tokens": 0,
                             "elapsed": 0.0, "skipped": 0, "bad_in_a_row": 0}
    trainer = None
    if resume is not None:
        ckpt.load_weights_into(model, resume)
        trainer = ckpt.load_trainer_state(resume)
        state.update({k: trainer.get(k, state[k]) for k in state})  # older: no skip counts
    elif start.init_from is not None:
        load_initial_weights(model, start.init_from)
    model.to(ctx.device).train()
    engine = wrap_model(PretrainingForward(model), ctx, fsdp=config.fsdp,
                        units=model.encoder.layers)
    optimizer = build_optimizer(model, config.optimizer, lr=config.lr,
                                weight_decay=config.weight_decay,
                                betas=(config.beta1, config.beta2), eps=config.eps)
    scheduler = build_scheduler(optimizer, config.steps, warmup_ratio=config.warmup_ratio,
                                schedule=config.schedule, power=config.power,
                                end_factor=config.min_lr_ratio)
    scaler = make_grad_scaler(config.precision, ctx.device)
    torch.manual_seed(config.seed + ctx.rank)  # dropout streams differ per rank
    if trainer is not None:
        restore_training_state(trainer, engine=engine, optimizer=optimizer, scheduler=scheduler,
                               scaler=scaler, collator=collator, ctx=ctx, fsdp=config.fsdp)
        if start.reschedule:  # a new --steps: the restored rule was the old total's
            reschedule(scheduler, schedule_rule(
                config.steps, warmup_ratio=config.warmup_ratio, schedule=config.schedule,
                power=config.power, end_factor=config.min_lr_ratio))
    if config.compile:
        # The encoder only: the model's input checks read values on the host (graph breaks),
        # and compiling in place keeps every state-dict key and the DDP/FSDP wrapping as is.
        model.encoder.compile()

    logger = TrainLogger(out, fields=LOG_FIELDS, tag="pretrain", total_steps=config.steps,
                         postfix=_bar_postfix(config.objective), enabled=ctx.is_main,
                         start_step=state["step"], tensorboard=config.tensorboard,
                         progress=config.progress)
    if resume is not None:
        logger.message(f"resumed from {ckpt.describe(resume)}")
    for note in start.notes:
        logger.message(note)
    if resume is None and fit.message is not None:
        logger.message(fit.message)
    if config.compile and ctx.device.type == "cpu":
        logger.message("note: on CPU the compiled encoder measured ~20% slower than the eager "
                       "fast path (README, Training)")
    batches = micro_batches(dataset, collator, config, (state["epoch"], state["block"]))
    rows = shard_slice(config.micro_batch, ctx)
    window = torch.zeros(6, dtype=torch.float64, device=ctx.device)  # sums since the last log
    guard = StepGuard(config.max_bad_steps, what="pretraining", lr=config.lr,
                      skipped=state["skipped"], in_a_row=state["bad_in_a_row"])
    window_tokens, window_start = 0, time.perf_counter()
    run_start = time.perf_counter() - state["elapsed"]
    fresh.begun()  # from here a failure keeps the run's files (its log, its checkpoints)
    try:
        while state["step"] < config.steps:
            micro = []  # mask every micro-batch first: the loss needs the step's target count
            for _ in range(config.grad_accum):
                epoch, block, batch = next(batches)
                micro.append(collator.apply_mask(batch))
            sums = torch.zeros(6, dtype=torch.float64, device=ctx.device)  # this step's
            _accumulate(engine, micro, config, ctx, scaler, rows, sums)
            step, lr = state["step"] + 1, scheduler.get_last_lr()[0]
            log_now = step % config.log_every == 0 or step == config.steps
            grad_norm, skipped = _optimizer_step(model, optimizer, scheduler, scaler, config, ctx,
                                                 guard, step, sums)
            if trim_above is not None and (resident_bytes() or 0) > trim_above:
                release_free_memory()
            if skipped is None:
                window += sums
            else:
                logger.message(skipped)
            tokens = sum(int(b["attention_mask"].sum()) for b in micro)
            state.update(step=step, epoch=epoch, block=block + 1,
                         samples=state["samples"] + config.batch_size,
                         tokens=state["tokens"] + tokens, skipped=guard.skipped,
                         bad_in_a_row=guard.in_a_row)
            window_tokens += tokens
            logger.advance()
            if log_now:
                now = time.perf_counter()
                totals = all_reduce_sum(window.clone(), ctx).tolist()
                logger.log(_record(totals, step=step, lr=lr, grad_norm=grad_norm,
                                   tokens=window_tokens, seconds=max(now - window_start, 1e-9),
                                   elapsed=now - run_start, state=state))
                window.zero_()
                window_tokens, window_start = 0, now
            if step % config.save_every == 0 or step == config.steps:
                state["elapsed"] = time.perf_counter() - run_start
                save_training_checkpoint(
                    out, model=model, engine=engine, optimizer=optimizer, scheduler=scheduler,
                    scaler=scaler, collator=collator, tokenizer=tokenizer, ctx=ctx, state=state,
                    extra={"pretrain": config.to_dict(), "step": step},
                    keep_last=config.keep_last, fsdp=config.fsdp)
        write = write_model_fn(model, engine, {"pretrain": config.to_dict(),
                                               "step": state["step"]}, config.fsdp, ctx.is_main,
                               what="the final model")
        final = out / "final"
        if ctx.is_main:
            publish_final(out, write, tokenizer)
        barrier(ctx)
        logger.message(f"done: {state['step']} steps; final model and tokenizer in {final}")
        return final
    except KeyboardInterrupt:
        raise Interrupted(_interrupted(out, state["step"], config.steps)) from None
    except RuntimeError as exc:  # torch.OutOfMemoryError is one
        failure = allocation_failure(exc, step=state["step"] + 1, fit=fit)
        if failure is None:
            raise
        raise failure from None
    finally:
        logger.close()


def _interrupted(out: Path, step: int, steps: int) -> str:
    """What Ctrl-C at ``step`` leaves and what to run to go on."""
    saved = ckpt.list_checkpoints(out)
    if not saved:
        return (f"interrupted at step {step} of {steps}, before the first checkpoint "
                f"(--save-every); the same command starts over")
    return (f"interrupted at step {step} of {steps}; the last checkpoint is step "
            f"{saved[-1][0]} in {str(out)!r}: resume with the same command and --resume")

