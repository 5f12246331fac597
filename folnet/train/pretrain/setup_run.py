"""A pretraining run's set-up: everything `folnet.train.pretrain.loop` needs before its first
step, made in the order a resumed run must repeat exactly (seeds, data order, model, optimiser,
schedule, then the restored state).

`set_up` claims OUT (`_claim`), reads the data and fits the micro-batches to the memory budget
(`_data`), builds the model (`_model`: a resumed run's weights, or ``--init-from``'s), wraps it
for DDP/FSDP, makes the optimiser, schedule and loss scaler, restores a resumed run's trainer
state and opens the log; what it made travels to the loop as one `Run`.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.optim import Optimizer
from torch.optim.lr_scheduler import LRScheduler
from torch.utils.data import Dataset

from folnet.arch import set_memory
from folnet.arch.io.model_dir import is_sharded_checkpoint
from folnet.atomic_write import atomic_write_json
from folnet.errors import FolnetError
from folnet.runtime import deterministic_algorithms
from folnet.train.data.masking import PretrainingCollator, most_targets
from folnet.train.data.packing import PackedCollator
from folnet.train.data.tokenizer import FolnetTokenizer
from folnet.train.engine import step_checkpoints as ckpt
from folnet.train.engine.amp import check_precision, make_grad_scaler
from folnet.train.engine.compiled import check_compile_mode, compile_module
from folnet.train.engine.distributed import DistContext, wrap_model
from folnet.train.engine.lock import RunLock
from folnet.train.engine.memory_budget import Fit
from folnet.train.engine.optim import build_optimizer, build_scheduler, reschedule, schedule_rule
from folnet.train.engine.runlog import TrainLogger
from folnet.train.engine.sharded import load_sharded_state
from folnet.train.engine.state import restore_training_state
from folnet.train.pretrain.config import PretrainConfig
from folnet.train.pretrain.fit import fit_pretraining_batch
from folnet.train.pretrain.inputs import (
    build_pretraining_model,
    check_inputs,
    run_dataset,
    run_tokenizer,
)
from folnet.train.pretrain.metrics import bar_postfix, log_fields
from folnet.train.pretrain.objectives import PretrainingForward, forward_of
from folnet.train.pretrain.start import RunStart, load_initial_weights, plan_start

__all__ = ["PretrainingForward", "Run", "set_up"]  # PretrainingForward: an encoder's engine


@dataclass
class Run:
    """What set-up makes for the step loop and the finish: the run's parts and its counters
    (``state``, saved in every checkpoint)."""

    config: PretrainConfig
    ctx: DistContext
    out: Path
    tokenizer: FolnetTokenizer
    dataset: Dataset
    collator: PretrainingCollator
    fit: Fit
    model: nn.Module
    engine: nn.Module
    optimizer: Optimizer
    scheduler: LRScheduler
    scaler: torch.amp.GradScaler
    state: dict[str, Any]
    logger: TrainLogger
    heldout: Dataset | None = None  # --heldout's rows (`folnet.train.pretrain.heldout`)

    @property
    def trim_above(self) -> int | None:
        """On a CPU, the resident size above which the heap, grown past the budget by
        fragmentation, is trimmed between steps."""
        return self.fit.budget if self.ctx.device.type == "cpu" else None


def _claim(config: PretrainConfig, ctx: DistContext, lock: RunLock
           ) -> tuple[PretrainConfig, RunStart]:
    """Check the options against the machine and OUT, plan the start (resume, init-from), then
    claim OUT (the lock) and record the options; seeds the global generators."""
    check_precision(config.precision, ctx.device)
    if config.compile:
        check_compile_mode(config.compile_mode, ctx.device)
    deterministic_algorithms(config.deterministic)
    out = Path(config.out)
    if config.micro_batch % ctx.world_size:
        raise FolnetError(f"--batch-size {config.batch_size} / --grad-accum {config.grad_accum} "
                          f"= {config.micro_batch} rows per micro-batch cannot be split over "
                          f"{ctx.world_size} processes")
    if out.is_dir():
        lock.acquire()  # before reading OUT's checkpoints: no other run may change them now
    start = plan_start(config, out)  # checks resume/init-from options; writes nothing
    config = start.config
    check_inputs(config, start.tokenizer_from)  # before OUT exists: a failure leaves nothing
    lock.acquire()  # creates OUT, refuses a second run, then clears what killed runs left
    if ctx.is_main:
        atomic_write_json(out / "run_config.json", config.to_dict())
    random.seed(config.seed)
    np.random.seed(config.seed)
    torch.manual_seed(config.seed)
    return config, start


def _data(config: PretrainConfig, start: RunStart, ctx: DistContext
          ) -> tuple[PretrainConfig, FolnetTokenizer, Dataset, Dataset | None,
                     PretrainingCollator, Fit]:
    """The tokenizer, the examples (and the held-out rows, or None) and the collator; the
    micro-batches fitted to the memory budget (a new run's ``config`` takes the fitted
    ``grad_accum``: a resumed run keeps its recorded micro-batches, on which its data order
    depends)."""
    out = Path(config.out)
    tokenizer = run_tokenizer(config, out, start.tokenizer_from, ctx)
    if ctx.is_main and (start.tokenizer_from is not None or config.tokenizer is not None):
        tokenizer.save(out / "tokenizer")  # a trained one is there already: other ranks read it
    dataset, heldout, data_config = run_dataset(config, tokenizer, out, ctx)
    decoder = PackedCollator.PREFIX if config.objective == "prefix" else PackedCollator.DECODER
    collator = {"decoder": PackedCollator(decoder),
                "encoder-decoder": PackedCollator(PackedCollator.ENCODER_DECODER)}.get(
        config.kind) or PretrainingCollator.from_config(tokenizer, data_config)
    fitted, fit = fit_pretraining_batch(config, tokenizer.vocab_size, ctx.device,
                                        ctx.world_size)
    if start.resume is None:
        config = fitted
        if fit.message is not None and ctx.is_main:
            atomic_write_json(out / "run_config.json", config.to_dict())
    return config, tokenizer, dataset, heldout, collator, fit


def _model(config: PretrainConfig, start: RunStart, vocab_size: int
           ) -> tuple[nn.Module, dict[str, Any], dict[str, Any] | None]:
    """The model (a resumed run's weights, or --init-from's), the run's counters and a resumed
    run's trainer state (None for a new run)."""
    model = build_pretraining_model(config, vocab_size)
    if config.kind == "encoder":
        # MLM logits only at the predicted positions: as many slots per sequence as the
        # masking can predict (`most_targets`), static shapes that no step has to read back
        model.gather_mlm = most_targets(config.seq_len, config.mlm_probability,
                                        config.max_predictions)
    model.relations = False  # the losses never read the final binary stream
    model.set_activation_checkpointing(config.activation_checkpointing)
    set_memory(model, config.memory_mode)
    state: dict[str, Any] = {"step": 0, "epoch": 0, "block": 0, "samples": 0, "tokens": 0,
                             "elapsed": 0.0, "skipped": 0, "bad_in_a_row": 0}
    trainer = None
    if start.resume is not None and is_sharded_checkpoint(start.resume):
        ckpt.check_architecture(model, start.resume)  # weights: once sharded (`set_up`)
    elif start.resume is not None:
        ckpt.load_weights_into(model, start.resume)
    if start.resume is not None:
        trainer = ckpt.load_trainer_state(start.resume)
        state.update({k: trainer.get(k, state[k]) for k in state})  # older: no skip counts
    elif start.init_from is not None:
        load_initial_weights(model, start.init_from)
    return model, state, trainer


def _layers(model: nn.Module, kind: str) -> list[nn.Module]:
    """The model's layers: FSDP's units."""
    if kind == "decoder":
        return list(model.layers)
    if kind == "encoder-decoder":
        return [*model.encoder_layers, *model.decoder_layers]
    return list(model.encoder.layers)


def set_up(config: PretrainConfig, ctx: DistContext, lock: RunLock) -> Run:
    """Everything before the first step: OUT claimed, data, model, optimiser and schedule (a
    resumed run's restored), the log opened. A failure here leaves OUT as it was
    (`FreshStart`)."""
    config, start = _claim(config, ctx, lock)
    config, tokenizer, dataset, heldout, collator, fit = _data(config, start, ctx)
    model, state, trainer = _model(config, start, tokenizer.vocab_size)
    model.to(ctx.device).train()
    forward = forward_of(config.kind, model)
    if config.compile:
        # The whole forward, losses and metrics: one graph (input values are not checked
        # while tracing, the MLM gather has static shapes), compiled in place before the
        # data-parallel wrapping, so every state-dict key stays as it is.
        compile_module(forward, config.compile_mode, ctx.device)
    engine = wrap_model(forward, ctx, fsdp=config.fsdp, units=_layers(model, config.kind))
    optimizer = build_optimizer(model, config.optimizer, lr=config.lr,
                                weight_decay=config.weight_decay,
                                betas=(config.beta1, config.beta2), eps=config.eps)
    rule = {"warmup_ratio": config.warmup_ratio, "schedule": config.schedule,
            "power": config.power, "end_factor": config.min_lr_ratio}
    scheduler = build_scheduler(optimizer, config.steps, **rule)
    scaler = make_grad_scaler(config.precision, ctx.device)
    if start.resume is not None and is_sharded_checkpoint(start.resume):
        # into this rank's shards of the wrapped model, whatever world size wrote them
        load_sharded_state(start.resume, engine=engine, model=model, optimizer=optimizer)
    torch.manual_seed(config.seed + ctx.rank)  # dropout streams differ per rank
    if trainer is not None:
        restore_training_state(trainer, engine=engine, optimizer=optimizer, scheduler=scheduler,
                               scaler=scaler, collator=collator, ctx=ctx, fsdp=config.fsdp)
        if start.reschedule:  # a new --steps: the restored rule was the old total's
            reschedule(scheduler, schedule_rule(config.steps, **rule))
    logger = _open_log(config, ctx, start, fit, state["step"])
    return Run(config=config, ctx=ctx, out=Path(config.out), tokenizer=tokenizer,
                dataset=dataset, heldout=heldout, collator=collator, fit=fit, model=model,
                engine=engine,
                optimizer=optimizer, scheduler=scheduler, scaler=scaler, state=state,
                logger=logger)


def _open_log(config: PretrainConfig, ctx: DistContext, start: RunStart, fit: Fit,
              step: int) -> TrainLogger:
    """The run's log from ``step`` on, with what the start decided."""
    logger = TrainLogger(config.out, fields=log_fields(config.objective), tag="pretrain",
                         total_steps=config.steps,
                         postfix=bar_postfix(config.objective), enabled=ctx.is_main,
                         start_step=step, tensorboard=config.tensorboard,
                         progress=config.progress, lines=not config.progress)
    if start.resume is not None:
        logger.message(f"resumed from {ckpt.describe(start.resume)}")
    for note in start.notes:
        logger.message(note)
    if start.resume is None and fit.message is not None:
        logger.message(fit.message)
    if config.compile and ctx.device.type == "cpu":
        logger.message("note: on CPU the compiled step measured slower than the eager fast "
                       "path (README, Training); padding is not trimmed while compiled")
    return logger
