"""Sharded training checkpoints: every rank writes its own shards, nothing is gathered.

Under ``--fsdp`` a checkpoint is ``OUT/checkpoints/step_N/`` with ``shards/`` (the weights
and optimiser state through torch.distributed.checkpoint, DCP: one file per rank and a
``.metadata`` index) in place of model.safetensors; config.json, the tokenizer files,
trainer.pt (everything else of the trainer state, RNG states of every rank included, which are
small and gathered) and checksums.json are rank 0's, as in a whole checkpoint
(`folnet.train.engine.step_checkpoints`). The keys inside are described in
`folnet.arch.io.sharded`; `folnet.arch.convert` reads such a checkpoint on one process and
converts it to a model directory.

Why the save stays atomic: rank 0 names one temporary directory and tells every rank; all
ranks write their shards into it; after a barrier rank 0 adds its files, checksums.json last,
and renames the directory to ``step_N``. A rank killed mid-write leaves only the temporary
(removed by the next run in OUT), and the checkpoints before it stay as they were.

Why a checkpoint of one world size resumes at another: DCP records each shard's place in the
whole tensor, and `load_sharded_state` asks for the shards this rank holds now, whatever
split wrote them. The same path serves a resume without FSDP (whole tensors on every rank).
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.optim import Optimizer

from folnet.arch.io.model_dir import SHARDS_DIR, model_metadata
from folnet.arch.io.sharded import MODEL_KEY, OPTIM_KEY
from folnet.atomic_write import (
    atomic_write_json,
    discard_dir,
    fsync_dir,
    fsync_tree,
    is_leftover,
    remove_tree,
    write_error,
)
from folnet.errors import FolnetError, NonFiniteError
from folnet.train.engine import step_checkpoints as ckpt
from folnet.train.engine.distributed import DistContext, barrier
from folnet.train.engine.guard import check_finite_weights

__all__ = ["load_sharded_state", "model_prefix", "save_sharded_checkpoint", "temporary_name"]


def model_prefix(engine: nn.Module, model: nn.Module) -> str:
    """The prefix of `model`'s keys in `engine`'s state dict (``"model."`` for a pretraining
    engine around it; empty when they are one)."""
    for name, module in engine.named_modules():
        if module is model:
            return f"{name}." if name else ""
    raise FolnetError("the training engine does not contain the model it trains")


def temporary_name(final: Path, token: str) -> Path:
    """The temporary directory a sharded save writes before it becomes `final`: a name
    `folnet.atomic_write.is_leftover` knows, so a crash's is removed by the next run."""
    path = final.parent / f".tmp-{final.name}-{os.getpid()}-{token}"
    if not is_leftover(path.name):  # a token of other than 8 hex digits
        raise FolnetError(f"temporary_name: token {token!r} must be 8 hex digits")
    return path


def _agreed(ctx: DistContext, value: Any) -> list[Any]:
    """`value` of every rank, on every rank."""
    if not ctx.is_distributed:
        return [value]
    values: list[Any] = [None] * ctx.world_size
    dist.all_gather_object(values, value)
    return values


def _check_local_weights(states: Mapping[str, torch.Tensor], ctx: DistContext,
                         what: str) -> None:
    """`check_finite_weights` of this rank's shards; any rank's verdict stops every rank."""
    local = {k: v.to_local() if hasattr(v, "to_local") else v for k, v in states.items()}
    try:
        check_finite_weights(local, what)
        verdict = None
    except NonFiniteError as exc:
        verdict = str(exc)
    faults = [v for v in _agreed(ctx, verdict) if v is not None]
    if faults:
        raise NonFiniteError(faults[0])


def _states(engine: nn.Module, model: nn.Module, optimizer: Optimizer
            ) -> tuple[dict[str, Any], str]:
    """This rank's DCP state (sharded tensors, no copy) and the model's key prefix."""
    from torch.distributed.checkpoint.state_dict import get_state_dict

    weights, optim = get_state_dict(engine, optimizer)
    prefix = model_prefix(engine, model)
    bare = {k.removeprefix(prefix): v for k, v in weights.items()}
    return {MODEL_KEY: bare, OPTIM_KEY: optim}, prefix


def save_sharded_checkpoint(out: Path, step: int, *, model: nn.Module, engine: nn.Module,
                            optimizer: Optimizer, tokenizer: ckpt.Saveable, ctx: DistContext,
                            trainer_state: Mapping[str, Any], extra: Mapping[str, Any],
                            keep_last: int) -> None:
    """Write ``OUT/checkpoints/step_{step}`` from every rank (collective: call on all).

    Raises `NonFiniteError` on every rank, before anything is written, when a weight is NaN or
    inf. A failed write on any rank fails the save on every rank (DCP gathers the faults),
    and rank 0 removes the temporary; the earlier checkpoints are left as they were."""
    import torch.distributed.checkpoint as dcp

    state, _prefix = _states(engine, model, optimizer)
    _check_local_weights(state[MODEL_KEY], ctx, f"checkpoint step_{step}")
    final = ckpt.checkpoint_dir(out) / f"step_{step}"
    # rank 0's name for all: the pid in it is rank 0's
    tmp = Path(_agreed(ctx, str(temporary_name(final, os.urandom(4).hex())))[0])
    if ctx.is_main:
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp.mkdir()
    barrier(ctx)
    try:
        dcp.save(state, checkpoint_id=str(tmp / SHARDS_DIR))
        barrier(ctx)
        fault = _write_main_files(tmp, final, model=model, tokenizer=tokenizer,
                                  trainer_state=trainer_state, extra=extra
                                  ) if ctx.is_main else None
    except BaseException:
        if ctx.is_main:
            remove_tree(tmp)
        raise
    # rank 0's fault is told to the others, which would otherwise wait for it at a barrier
    told = _agreed(ctx, None if fault is None else str(fault))[0]
    if fault is not None:
        remove_tree(tmp)
        raise fault
    if told is not None:
        raise FolnetError(f"checkpoint step_{step}: rank 0 could not write it ({told})")
    if ctx.is_main:
        ckpt.prune_checkpoints(out, keep_last)
    barrier(ctx)


def _write_main_files(tmp: Path, final: Path, *, model: nn.Module, tokenizer: ckpt.Saveable,
                      trainer_state: Mapping[str, Any], extra: Mapping[str, Any]
                      ) -> Exception | None:
    """Rank 0's part: config.json, the tokenizer, trainer.pt and checksums.json beside the
    shards, then the rename into place. Returns what failed (None: nothing), not raises it."""
    try:
        trainer = {**trainer_state, ckpt.SHARDED_KEY: SHARDS_DIR}
        ckpt.write_checkpoint_files(
            tmp, write_model=lambda d: atomic_write_json(
                d / "config.json", {**model_metadata(model), **extra}),
            tokenizer=tokenizer, trainer_state=trainer)
        _publish(tmp, final)
    except Exception as exc:
        return exc
    return None


def _publish(tmp: Path, final: Path) -> None:
    """Flush `tmp` and rename it to `final` (an older `final` renamed aside and deleted)."""
    try:
        fsync_tree(tmp)
        if final.exists():
            discard_dir(final)
        os.replace(tmp, final)
        fsync_dir(final.parent)
    except OSError as exc:
        raise write_error(final, exc, kept="nothing of it was kept and the checkpoints "
                                           "before it are unchanged") from exc


def load_sharded_state(checkpoint: Path, *, engine: nn.Module, model: nn.Module,
                       optimizer: Optimizer) -> None:
    """Load a sharded checkpoint's weights and optimiser state into this rank's part of
    `engine` and `optimizer` (collective under a process group: call on every rank). The
    checkpoint may come from any number of ranks; every weight of the model must be there.

    Parameters that never got a gradient have no optimiser state in the checkpoint; theirs
    stays as initialised here (they are never stepped)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import DefaultLoadPlanner, FileSystemReader
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict

    shards = Path(checkpoint) / SHARDS_DIR
    state, prefix = _states(engine, model, optimizer)
    stored = FileSystemReader(str(shards)).read_metadata().state_dict_metadata
    missing = [k for k in state[MODEL_KEY] if f"{MODEL_KEY}.{k}" not in stored]
    if missing:
        raise FolnetError(f"--resume: {shards} holds no weights for {missing[:6]} "
                          f"({len(missing)} of the model's {len(state[MODEL_KEY])})")
    with warnings.catch_warnings():  # one process without a group: DCP warns, as meant
        if not dist.is_initialized():
            warnings.simplefilter("ignore", UserWarning)
        dcp.load(state, checkpoint_id=str(shards),
                 planner=DefaultLoadPlanner(allow_partial_load=True),
                 no_dist=not dist.is_initialized())
    weights = {prefix + k: v for k, v in state[MODEL_KEY].items()}
    set_state_dict(engine, optimizer, model_state_dict=weights,
                   optim_state_dict=state[OPTIM_KEY], options=StateDictOptions(strict=False))
