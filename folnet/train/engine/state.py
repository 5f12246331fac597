"""What a training loop saves and restores, for plain, DDP and FSDP models alike.

`save_training_checkpoint` gathers what every rank holds (RNG states) and lets rank 0 write it
through `folnet.train.engine.step_checkpoints`; under FSDP every rank writes its parameter and
optimiser shards itself (`folnet.train.engine.sharded`) and rank 0 the rest.
`restore_training_state` puts it back on every rank. `write_model_fn` is the model writer both
the checkpoints and the final model use, and `publish_final` writes ``OUT/final``.

Why the weights are checked in `write_model_fn`: it is the one place every checkpoint and final
model of a training run passes through, on every rank, before anything is written; weights
with a NaN or inf stop the run there (`folnet.train.engine.guard.check_finite_weights`)
instead of being saved as if trained.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import nn
from torch.optim import Optimizer
from torch.optim.lr_scheduler import LRScheduler

from folnet.arch import FolnetModel
from folnet.atomic_write import atomic_write_dir
from folnet.checksums import write_manifest
from folnet.errors import FolnetError, NonFiniteError
from folnet.train.engine import step_checkpoints as ckpt
from folnet.train.engine.distributed import DistContext, barrier
from folnet.train.engine.guard import check_finite_weights
from folnet.train.engine.sharded import save_sharded_checkpoint

__all__ = ["Stateful", "keyed_by_name", "publish_final", "restore_training_state",
           "save_training_checkpoint", "write_model_fn"]


def _full_state(engine: nn.Module) -> dict[str, torch.Tensor]:
    """The unsharded weights of an FSDP engine, keys as in the bare model (collective)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    full = get_model_state_dict(engine, options=StateDictOptions(full_state_dict=True,
                                                                 cpu_offload=True))
    return {k.removeprefix("model."): v for k, v in full.items()}


def write_model_fn(model: nn.Module, engine: nn.Module, extra: Mapping[str, Any],
                   fsdp: bool, is_main: bool = True, *, what: str = "the model"
                   ) -> Callable[[Path], Any]:
    """A directory writer of config.json + model.safetensors (call on every rank under FSDP:
    gathering the shards is collective, and only rank 0 receives the full weights).

    Raises `NonFiniteError` on every rank, before anything is written, when a weight is NaN or
    inf; ``what`` names the model in that message (``"checkpoint step_500"``).
    """
    source = model
    if fsdp:
        full = _full_state(engine)
        _check_gathered(full if is_main else {}, what)
        if not is_main:
            return lambda directory: None
        with torch.device("meta"):  # fully_shard changed model's class: rebuild a plain one
            source = FolnetModel(model.cfg, head=model.head, num_labels=model.num_labels)
        source.load_state_dict(full, assign=True)
    else:
        check_finite_weights(model, what)  # DDP ranks hold the same weights: all raise alike
    return lambda directory: source.save_pretrained(directory, dict(extra))


def _check_gathered(full: Mapping[str, torch.Tensor], what: str) -> None:
    """`check_finite_weights` of FSDP's gathered weights, which only rank 0 holds: its verdict
    goes to every rank, so that all of them stop together rather than wait for rank 0."""
    try:
        check_finite_weights(full, what)
        verdict = [None]
    except NonFiniteError as exc:
        verdict = [str(exc)]
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.broadcast_object_list(verdict, src=0)
    if verdict[0] is not None:
        raise NonFiniteError(verdict[0])


def keyed_by_name(state: Mapping[str, Any], optimizer: Optimizer, engine: nn.Module
                  ) -> dict[str, Any]:
    """A whole optimiser state keyed by parameter name, as FSDP's loader wants it.

    A checkpoint written without FSDP holds ``optimizer.state_dict()``, keyed by each
    parameter's index in the parameter groups; the optimiser made now for the same model
    lists its parameters in the same order, which gives each index its name in `engine`.
    A state keyed by name already (a gathered FSDP checkpoint) is returned as it is."""
    groups = state.get("param_groups") or []
    if all(isinstance(i, str) for g in groups for i in g["params"]):
        return dict(state)
    names = {id(p): name.removeprefix("module.") for name, p in engine.named_parameters()}
    order = [names[id(p)] for group in optimizer.param_groups for p in group["params"]]
    ids = [i for g in groups for i in g["params"]]
    if len(ids) != len(order):
        raise FolnetError(f"--resume: the checkpoint's optimiser state has {len(ids)} "
                          f"parameters, the optimiser now {len(order)}")
    name = dict(zip(ids, order, strict=True))
    return {"state": {name[i]: v for i, v in state["state"].items()},
            "param_groups": [{**g, "params": [name[i] for i in g["params"]]} for g in groups]}


class Stateful(Protocol):
    """What a checkpoint keeps of an object besides the model (the MLM collator's generator)."""

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: Mapping[str, Any]) -> None: ...


def save_training_checkpoint(out: Path, *, model: nn.Module, engine: nn.Module,
                             optimizer: Optimizer, scheduler: LRScheduler,
                             scaler: torch.amp.GradScaler, collator: Stateful,
                             tokenizer: ckpt.Saveable, ctx: DistContext,
                             state: Mapping[str, Any], extra: Mapping[str, Any],
                             keep_last: int, fsdp: bool) -> None:
    """Every rank contributes (RNG states); rank 0 writes; all wait for it. Under FSDP the
    checkpoint is sharded: every rank writes its shards, nothing is gathered."""
    rng = ckpt.capture_rng(ctx.device)
    gathered: list[Any] = [rng]
    if ctx.is_distributed:
        gathered = [None] * ctx.world_size
        torch.distributed.all_gather_object(gathered, rng)
    step = int(state["step"])
    trainer = {**state, "scheduler": scheduler.state_dict(), "scaler": scaler.state_dict(),
               "collator": collator.state_dict(), "rng": gathered,
               "world_size": ctx.world_size}
    if fsdp:
        save_sharded_checkpoint(out, step, model=model, engine=engine, optimizer=optimizer,
                                tokenizer=tokenizer, ctx=ctx, trainer_state=trainer,
                                extra=extra, keep_last=keep_last)
        return
    optimizer_state = optimizer.state_dict()
    write = write_model_fn(model, engine, extra, fsdp, ctx.is_main,
                           what=f"checkpoint step_{step}")
    if ctx.is_main:
        ckpt.save_checkpoint(out, step, write_model=write, tokenizer=tokenizer,
                             trainer_state={**trainer, "optimizer": optimizer_state},
                             keep_last=keep_last)
    barrier(ctx)


def restore_training_state(trainer: Mapping[str, Any], *, engine: nn.Module,
                           optimizer: Optimizer, scheduler: LRScheduler,
                           scaler: torch.amp.GradScaler, collator: Stateful, ctx: DistContext,
                           fsdp: bool) -> None:
    """Load optimiser, scheduler, scaler and collator states, then this rank's RNG states.
    Call it last before the loop: nothing may draw random numbers in between. A sharded
    checkpoint's optimiser state is not in `trainer`: `load_sharded_state` loaded it with the
    weights."""
    if ckpt.SHARDED_KEY in trainer:
        pass
    elif fsdp:
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            set_optimizer_state_dict,
        )

        # strict=False: parameters that never got a gradient have no optimiser state.
        set_optimizer_state_dict(engine, optimizer,
                                 keyed_by_name(trainer["optimizer"], optimizer, engine),
                                 options=StateDictOptions(full_state_dict=True, strict=False))
    else:
        optimizer.load_state_dict(trainer["optimizer"])
    scheduler.load_state_dict(trainer["scheduler"])
    if trainer.get("scaler"):
        scaler.load_state_dict(trainer["scaler"])
    collator.load_state_dict(trainer["collator"])
    rngs = trainer["rng"]
    # Same world size: each rank continues its own streams. Otherwise only the shared ones
    # (data order, masks) continue exactly; dropout streams of the new ranks start afresh.
    own = rngs[ctx.rank] if len(rngs) == ctx.world_size else rngs[0]
    ckpt.restore_rng(own, ctx.device)
    if len(rngs) != ctx.world_size and ctx.rank > 0:
        torch.manual_seed(int(trainer["step"]) * 7919 + ctx.rank)


def publish_final(out: Path, write: Callable[[Path], Any], tokenizer: ckpt.Saveable) -> Path:
    """Write ``OUT/final`` (model + tokenizer + ``checksums.json``) atomically, replacing an
    earlier one."""
    def write_all(directory: Path) -> None:
        write(directory)
        tokenizer.save(directory)
        write_manifest(directory)  # last: it covers every other file

    return atomic_write_dir(out / "final", write_all)
