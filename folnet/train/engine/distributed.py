"""Multi-process data parallel training under ``torchrun``: DDP (or FSDP) and batch sharding.

One command serves one process, one machine or many: ``torchrun`` sets RANK, WORLD_SIZE and
LOCAL_RANK (plus MASTER_ADDR/PORT), `init_distributed` reads them and joins the process group
(NCCL on CUDA, gloo on CPU); without them the same code runs as a single process. Across
machines, `folnet.train.engine.peers` picks gloo's interface and ends a rank that cannot reach
its peers in one line.

Why the whole global micro-batch is materialised on every rank: the MLM collator draws one set
of random numbers per batch from its own generator, so the masks of a row depend on the batch
it is drawn with. Every rank therefore reads and masks the same global micro-batch (token ids
only: kilobytes) and keeps its contiguous share of the rows (`shard_slice`). N processes with
B/N rows each then see exactly the rows and masks one process sees with B rows, and the
collator generator is identical on every rank, so rank 0's checkpoint is everyone's.
"""

from __future__ import annotations

import contextlib
import gc
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from folnet.atomic_write import warn
from folnet.errors import FolnetError
from folnet.train.engine.peers import (
    advertise_route_to_master,
    connect_timeout,
    connecting,
    shared_store_warning,
)

__all__ = [
    "DistContext",
    "GlobalBatchSampler",
    "all_reduce_sum",
    "barrier",
    "gradient_sync",
    "init_distributed",
    "resolve_device",
    "shard_slice",
    "shutdown",
    "to_device",
    "wrap_model",
]


@dataclass(frozen=True)
class DistContext:
    """Where this process stands: rank, world size, its device and the backend in use."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    backend: str | None = None
    owns_group: bool = False  # we created the process group, so we destroy it

    @property
    def is_main(self) -> bool:
        """Rank 0 alone logs, shows progress and writes files."""
        return self.rank == 0

    @property
    def is_distributed(self) -> bool:
        return self.world_size > 1


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise FolnetError(f"environment variable {name}={raw!r} is not an integer") from None


def resolve_device(device: str, local_rank: int = 0) -> torch.device:
    """The torch device a ``--device`` value names, checked before any work starts.

    ``auto`` is this process's GPU when CUDA is available, else the CPU. ``cuda`` is this
    process's GPU: under torchrun, local rank r of a machine takes GPU r (modulo the GPUs
    there), so every process of one command gets its own. ``cuda:N`` is GPU N, which must
    exist. Anything else must be a torch device name (``cpu``, ``mps``, ...). A GPU that is
    asked for and absent is a `FolnetError` naming the value, never a failure later on.
    """
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        resolved = torch.device(device)
    except (RuntimeError, TypeError):
        raise FolnetError(f"--device {device!r} is not a torch device "
                          f"(use auto, cpu, cuda or cuda:N)") from None
    if resolved.type != "cuda":
        return resolved
    if not torch.cuda.is_available():
        raise FolnetError(f"--device {device!r} was requested but CUDA is not available")
    count = torch.cuda.device_count()
    if resolved.index is None:
        return torch.device("cuda", local_rank % max(1, count))
    if resolved.index >= count:
        raise FolnetError(f"--device {device!r}: this machine has {count} CUDA device(s), "
                          f"cuda:0 to cuda:{count - 1}")
    return resolved


def init_distributed(device: str = "auto", *, group: bool = False) -> DistContext:
    """Join the torchrun process group when WORLD_SIZE > 1; otherwise a single process.

    ``group`` (``--fsdp``): a single process gets a process group of one too, since FSDP's
    sharding and torch.distributed.checkpoint's collectives need one; so a run of one process
    writes the same sharded checkpoints as a run of many, and either resumes the other."""
    world = _env_int("WORLD_SIZE", 1)
    rank = _env_int("RANK", 0)
    local_rank = _env_int("LOCAL_RANK", 0)
    if world < 1 or not 0 <= rank < world:
        raise FolnetError(f"RANK={rank} and WORLD_SIZE={world} are inconsistent: need "
                          f"0 <= RANK < WORLD_SIZE")
    dev = resolve_device(device, local_rank)
    if world == 1 and not group:
        return DistContext(device=dev)
    backend = "nccl" if dev.type == "cuda" else "gloo"
    owns = False
    if not dist.is_initialized():
        if dev.type == "cuda":
            torch.cuda.set_device(dev)
        if world == 1 and "MASTER_ADDR" not in os.environ:  # no torchrun: an in-memory store
            dist.init_process_group(backend=backend, store=dist.HashStore(), rank=0,
                                    world_size=1)
            owns = True
        else:
            if backend == "gloo":
                advertise_route_to_master(os.environ.get("MASTER_ADDR"))
            warning = shared_store_warning()
            if warning is not None and rank == 0:
                warn(warning)
            with connecting(rank, connect_timeout()):  # one line, not a hang, if no answer
                dist.init_process_group(backend=backend, init_method="env://", rank=rank,
                                        world_size=world)
                owns = True
                # every pair connected (NCCL connects at the first collective, on this GPU)
                dist.barrier(device_ids=[dev.index] if dev.type == "cuda" else None)
    return DistContext(rank=rank, world_size=world, local_rank=local_rank, device=dev,
                       backend=backend, owns_group=owns)


def shutdown(ctx: DistContext, *, finished: bool = False) -> None:
    """Destroy the process group this run made. ``finished`` (every rank got to the end): meet
    at a barrier first, so that no rank tears its group down while a peer still talks on it
    (gloo can abort a rank at exit when another leaves early). After a failure there is no
    barrier: a peer may never arrive.

    The garbage is collected first: a sharded engine (FSDP's states, parameter groups and
    device mesh) is a web of reference cycles that outlives the run's frames, and it holds the
    group. Left to a later collection, it is freed after the group is torn down, or during the
    interpreter's finalisation, where a rank can abort ("terminate called without an active
    exception", under load)."""
    if ctx.owns_group and dist.is_initialized():
        gc.collect()
        if finished and ctx.is_distributed:
            dist.barrier()
        dist.destroy_process_group()


def barrier(ctx: DistContext) -> None:
    if ctx.is_distributed:
        dist.barrier()


def all_reduce_sum(tensor: torch.Tensor, ctx: DistContext) -> torch.Tensor:
    """Sum `tensor` over ranks in place (no-op for one process); returns it."""
    if ctx.is_distributed:
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return tensor


def to_device(tensors: dict[str, torch.Tensor], device: torch.device
              ) -> dict[str, torch.Tensor]:
    """Host tensors onto the training device without the host waiting: on an accelerator
    through pinned memory with ``non_blocking`` (a copy from pageable memory first drains the
    device's queue); on the CPU as they are."""
    if device.type == "cpu":
        return dict(tensors)
    return {k: v.pin_memory().to(device, non_blocking=True) for k, v in tensors.items()}


def shard_slice(rows: int, ctx: DistContext) -> slice:
    """This rank's contiguous block of a global micro-batch of `rows` rows."""
    if rows % ctx.world_size:
        raise FolnetError(f"a global micro-batch of {rows} rows cannot be split evenly over "
                          f"{ctx.world_size} processes")
    share = rows // ctx.world_size
    return slice(ctx.rank * share, (ctx.rank + 1) * share)


class GlobalBatchSampler:
    """An endless stream of global micro-batches of dataset indices (a DataLoader
    ``batch_sampler``), identical on every rank.

    Epoch e visits a permutation drawn from ``(seed, e)`` in blocks of `micro_batch`; the last
    incomplete block of an epoch is dropped. ``start`` = (epoch, block) resumes mid-epoch
    without replaying anything, because no state is carried from one epoch to the next.
    """

    def __init__(self, num_examples: int, micro_batch: int, *, seed: int = 0,
                 shuffle: bool = True, start: tuple[int, int] = (0, 0)) -> None:
        if micro_batch < 1:
            raise FolnetError(f"micro-batch size must be >= 1, got {micro_batch}")
        if num_examples < micro_batch:
            raise FolnetError(f"the dataset has {num_examples} examples, fewer than one global "
                              f"micro-batch of {micro_batch}; lower --batch-size or raise "
                              f"--grad-accum, or use more data")
        self.num_examples = num_examples
        self.micro_batch = micro_batch
        self.seed = seed
        self.shuffle = shuffle
        self.start = start

    @property
    def batches_per_epoch(self) -> int:
        return self.num_examples // self.micro_batch

    def order(self, epoch: int) -> np.ndarray:
        if not self.shuffle:
            return np.arange(self.num_examples)
        return np.random.default_rng((self.seed, epoch)).permutation(self.num_examples)

    def __iter__(self) -> Iterator[list[int]]:
        epoch, block = self.start
        while True:
            order = self.order(epoch)
            for b in range(block, self.batches_per_epoch):
                yield order[b * self.micro_batch:(b + 1) * self.micro_batch].tolist()
            epoch, block = epoch + 1, 0


def wrap_model(model: nn.Module, ctx: DistContext, *, fsdp: bool = False,
               units: Iterable[nn.Module] = ()) -> nn.Module:
    """DDP, or FSDP2 (``fully_shard`` on each of `units`, then on the root), when distributed;
    else the model as is.

    With FOLNet's encoder layers as the units, the embeddings and heads stay in the root unit,
    so the MLM decoder, tied to the word embedding, always sees the full matrix.
    """
    if fsdp:
        try:
            from torch.distributed.device_mesh import init_device_mesh
            from torch.distributed.fsdp import fully_shard
        except ImportError as exc:  # pragma: no cover - torch < 2.6
            raise FolnetError(f"--fsdp needs torch.distributed.fsdp.fully_shard: {exc}") from None
        if not dist.is_initialized():
            raise FolnetError("--fsdp needs a process group: launch with torchrun")
        mesh = init_device_mesh(ctx.device.type, (ctx.world_size,))
        for unit in units:
            fully_shard(unit, mesh=mesh)
        fully_shard(model, mesh=mesh)
        return model
    if not ctx.is_distributed:
        return model
    ids = [ctx.device.index] if ctx.device.type == "cuda" else None
    # Some parameters may get no gradient (FOLNet's last binary-output operators feed nothing
    # the pretraining heads read): DDP must look for them each step.
    return nn.parallel.DistributedDataParallel(model, device_ids=ids,
                                               find_unused_parameters=True)


@contextlib.contextmanager
def gradient_sync(model: nn.Module, enabled: bool) -> Iterator[None]:
    """Skip the gradient all-reduce on accumulation micro-batches (DDP ``no_sync``, FSDP2
    ``set_requires_gradient_sync``); the last micro-batch of a step synchronises."""
    if enabled:
        yield
        return
    target = getattr(model, "_orig_mod", model)
    if isinstance(target, nn.parallel.DistributedDataParallel):
        with target.no_sync():
            yield
    elif hasattr(target, "set_requires_gradient_sync"):
        target.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            target.set_requires_gradient_sync(True)
    else:
        yield
