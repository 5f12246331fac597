"""Fit a training step to the machine: estimate its peak memory, split the batch to fit.

Why before the first step: a batch that does not fit ends a CPU run in the kernel's OOM killer
(or swaps the machine to a halt) and a GPU run in an allocation error, minutes in, after the
corpus was tokenised. The defaults a newcomer types (batch 256 x T 128) need more memory than
many machines have (docs/results/measurements.md); `fit_batch` finds the fewest micro-batches
(gradient accumulation: the same sequences per optimiser step, the same loss and gradients to
float32 rounding) whose step fits a budget, and says what it chose. A batch of one sequence
that still does not fit stops the run before training, naming the memory it needs and the
options that lower it.

The estimate (`StepMemory`) is the `folnet.arch.info` model -- the bytes autograd saves for the
backward pass of one sequence, counted on the meta device -- scaled by a factor that relates
it to the resident peak of real steps (`CPU_HEAP_FACTOR`), plus what does not grow with the
batch: weights, gradients and two optimiser moments, and the process itself (torch, the
tokenised corpus). On a CPU the factor covers glibc's heap as `folnet.runtime` tunes it
(freed blocks are kept for reuse, so the heap ends above the live peak).

The budget (``--memory-budget``) defaults on a CPU to what the model needs -- the peak of a
step of 8 sequences, at least 3 GiB -- within 80% of the memory the machine has
available, shared by the processes of one run (torchrun's local ones, the parallel rows of
``folnet ablate --jobs N``); on a GPU, 90% of the device's free memory. ``off`` keeps the batch
as asked. Why neither a fixed budget nor the machine's: a fixed one stops a model whose one
sequence needs more, and one that follows the machine lets a tiny model's first run take
half of a large machine (docs/results/measurements.md).
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass
from pathlib import Path

import torch

from folnet.errors import FolnetError

__all__ = ["CPU_HEAP_FACTOR", "CPU_NEED_ROWS", "DEFAULT_CPU_BUDGET", "SHARE_ENV", "Fit",
           "StepMemory", "allocation_failure", "available_bytes", "fit_batch", "format_bytes",
           "parse_budget", "process_bytes", "resolve_budget", "sharing_processes"]

GiB = 1 << 30
#: A CPU run's 'auto' step budget: what a step of `CPU_NEED_ROWS` sequences needs, at least
#: `DEFAULT_CPU_BUDGET`, at most 80% of the memory available (the budget where that cannot
#: be read). What a model needs sets it, not the machine's size.
DEFAULT_CPU_BUDGET = 3 * GiB
CPU_NEED_ROWS = 8
#: Resident peak over saved-for-backward bytes, per sequence: the estimate's scale on a CPU
#: (docs/results/measurements.md).
CPU_HEAP_FACTOR = 1.0
CUDA_FACTOR = 1.0
#: Resident memory of a training process before its first step (torch, corpus, tokenizer),
#: with a CPU build of torch.
PROCESS_BYTES = 700 << 20
#: What a CUDA build of torch adds to it, on a CPU run too: its GPU libraries are mapped at
#: import and partly resident (docs/results/measurements.md). pip's default torch on Linux is
#: such a build.
CUDA_BUILD_BYTES = 400 << 20
_UNITS = {"": 1, "b": 1, "k": 1 << 10, "kb": 1000, "kib": 1 << 10, "m": 1 << 20,
          "mb": 1000 ** 2, "mib": 1 << 20, "g": GiB, "gb": 1000 ** 3, "gib": GiB,
          "t": 1 << 40, "tb": 1000 ** 4, "tib": 1 << 40}
_SIZE = re.compile(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*")


def format_bytes(n: float) -> str:
    return f"{n / GiB:.1f} GiB" if n >= GiB else f"{n / (1 << 20):.0f} MiB"


def parse_budget(text: str | None, option: str = "--memory-budget") -> int | None:
    """``'auto'``/None -> 0 (the machine decides), ``'off'`` -> None (no limit), else a size
    such as ``'3GiB'``, ``'3.5G'``, ``'800MiB'`` in bytes."""
    if text is None or str(text).strip().lower() == "auto":
        return 0
    if str(text).strip().lower() == "off":
        return None
    match = _SIZE.fullmatch(str(text))
    unit = match.group(2).lower() if match else ""
    if match is None or unit not in _UNITS:
        raise FolnetError(f"{option} {text!r} is not a size: use e.g. 3GiB, 800MiB, 'auto' or "
                          f"'off'")
    value = float(match.group(1)) * _UNITS[unit]
    if not 64 << 20 <= value <= 1 << 50:
        raise FolnetError(f"{option} {text!r} is outside 64 MiB .. 1 PiB")
    return int(value)


def _cgroup_room() -> int | None:
    """What the process's cgroup (v2, or v1) still allows, or None without a limit."""
    for limit_file, usage_file in (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
                                   ("/sys/fs/cgroup/memory/memory.limit_in_bytes",
                                    "/sys/fs/cgroup/memory/memory.usage_in_bytes")):
        try:
            limit = Path(limit_file).read_text().strip()
            usage = int(Path(usage_file).read_text().strip())
        except (OSError, ValueError):
            continue
        if limit.isdigit() and int(limit) < 1 << 60:
            return max(int(limit) - usage, 0)
    return None


def available_bytes(device: torch.device) -> int | None:
    """Memory a new allocation can still get: free device memory on a GPU; on a CPU the
    kernel's MemAvailable, lowered to the cgroup's room where one is set. None if unknown."""
    if device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(device)
        return int(free)
    room = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                room = int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        room = None
    cgroup = _cgroup_room()
    if cgroup is not None:
        room = cgroup if room is None else min(room, cgroup)
    if room is None and hasattr(os, "sysconf"):
        try:
            room = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (OSError, ValueError):
            room = None
    return room


def resolve_budget(text: str | None, device: torch.device, *,
                   memory: StepMemory | None = None) -> tuple[int | None, str]:
    """The step's budget in bytes (None: no limit) and where it comes from, for the log.
    ``memory``: the step's estimate; on a CPU, 'auto' is at most its peak with micro-batches
    of `CPU_NEED_ROWS` sequences (and never under `DEFAULT_CPU_BUDGET`), so that a small
    model's run stays small on a large machine."""
    asked = parse_budget(text)
    if asked is None:
        return None, "--memory-budget off"
    room = available_bytes(device)
    if asked:
        return asked, "--memory-budget"
    share = sharing_processes()
    each = f", shared by {share} processes" if share > 1 else ""
    if device.type == "cuda":
        return int(0.9 * (room or 0)), "90% of the GPU's free memory"
    if room is None:
        return DEFAULT_CPU_BUDGET, "the default CPU budget (the available memory is unknown)"
    machine = int(0.8 * room / share)
    need = max(DEFAULT_CPU_BUDGET, memory.peak(CPU_NEED_ROWS) if memory else 0)
    if need < machine:
        return need, (f"the default CPU budget for this model (a step of {CPU_NEED_ROWS} "
                      f"sequences, at least {format_bytes(DEFAULT_CPU_BUDGET)})")
    return machine, f"80% of the {format_bytes(room)} available{each}"


#: Set by a parent that starts several training processes on this machine at once (`folnet
#: ablate --jobs N` sets N): each takes its share of the memory 'auto' budgets.
SHARE_ENV = "FOLNET_PARALLEL_JOBS"


def sharing_processes() -> int:
    """How many training processes of one run share this machine's memory: torchrun's
    ``LOCAL_WORLD_SIZE``, or the parallel rows `SHARE_ENV` announces (1 when neither says)."""
    counts = [1]
    for name in ("LOCAL_WORLD_SIZE", SHARE_ENV):
        try:
            counts.append(int(os.environ.get(name, "1")))
        except ValueError:
            continue
    return max(counts)


def process_bytes() -> int:
    """The resident memory a CPU training process holds before its first step, for the torch
    build this process imported (`PROCESS_BYTES`, plus `CUDA_BUILD_BYTES` for a CUDA build)."""
    return PROCESS_BYTES + (CUDA_BUILD_BYTES if torch.version.cuda is not None else 0)


@dataclass(frozen=True)
class StepMemory:
    """Peak bytes of one optimiser step as ``fixed + per_sequence * micro_batch``."""

    fixed: int  # the process, weights, gradients, optimiser moments
    per_sequence: int  # what one more sequence in the micro-batch adds

    def peak(self, micro_batch: int) -> int:
        return self.fixed + self.per_sequence * micro_batch

    @classmethod
    def of(cls, saved_bytes: int, head_bytes: int, parameters: int, device: torch.device
           ) -> StepMemory:
        """From the bytes autograd saves per sequence (`folnet.arch.info`), the output head's
        per-sequence logits and the parameter count."""
        factor = CUDA_FACTOR if device.type == "cuda" else CPU_HEAP_FACTOR
        fixed = 4 * parameters * 4 + (process_bytes() if device.type == "cpu" else 0)
        return cls(fixed=fixed, per_sequence=math.ceil(factor * (saved_bytes + head_bytes)))


@dataclass(frozen=True)
class Fit:
    """What `fit_batch` chose: micro-batches per step and the estimate it rests on."""

    grad_accum: int
    micro_batch: int
    peak: int
    budget: int | None
    message: str | None  # None: the batch fitted as asked


def fit_batch(batch_size: int, grad_accum: int, world_size: int, memory: StepMemory,
              budget: int | None, source: str, *, seq_len: int) -> Fit:
    """The fewest micro-batches per step, at least ``grad_accum``, whose micro-batch divides the
    batch, splits over ``world_size`` processes and fits ``budget`` per process."""
    def fits(accum: int) -> bool:
        return budget is None or memory.peak(batch_size // accum // world_size) <= budget

    candidates = [a for a in range(grad_accum, batch_size + 1)
                  if batch_size % a == 0 and (batch_size // a) % world_size == 0]
    asked = batch_size // grad_accum
    chosen = next((a for a in candidates if fits(a)), None)
    if chosen is None:
        smallest = batch_size // candidates[-1] // world_size if candidates else 1
        raise FolnetError(
            f"a step of {smallest} sequence(s) of {seq_len} tokens needs about "
            f"{format_bytes(memory.peak(smallest))} per process, more than {source} "
            f"({format_bytes(budget or 0)}): lower --seq-len or the model size "
            f"(--preset, --model), or raise --memory-budget")
    micro = batch_size // chosen
    peak = memory.peak(micro // world_size)
    if chosen == grad_accum:
        return Fit(chosen, micro, peak, budget, None)
    return Fit(chosen, micro, peak, budget, (
        f"batch {batch_size} x T {seq_len} needs about "
        f"{format_bytes(memory.peak(asked // world_size))} per step, over {source} "
        f"({format_bytes(budget or 0)}): split into {chosen} "
        f"micro-batches of {micro} (gradient accumulation: the same {batch_size} sequences per "
        f"step), about {format_bytes(peak)}; --memory-budget sets the budget"))


_ASKED = re.compile(r"(?:tried to allocate|Tried to allocate)\s+([0-9.]+)\s*([A-Za-z]*)")


def allocation_failure(exc: BaseException, *, step: int, fit: Fit | None) -> FolnetError | None:
    """A one-line `FolnetError` for an allocation that failed during ``step`` (torch's
    ``DefaultCPUAllocator: can't allocate memory`` or a CUDA out-of-memory), naming the memory
    asked for and what to lower; None for any other error."""
    text = str(exc)
    oom = isinstance(exc, torch.OutOfMemoryError) or (
        isinstance(exc, RuntimeError) and ("can't allocate memory" in text
                                           or "out of memory" in text.lower()))
    if not oom:
        return None
    match = _ASKED.search(text)
    asked = "memory"
    if match:
        asked = format_bytes(float(match.group(1)) * _UNITS.get(match.group(2).lower(), 1))
    planned = (f"; the step was estimated at {format_bytes(fit.peak)} with micro-batches of "
               f"{fit.micro_batch}" if fit is not None else "")
    return FolnetError(f"step {step}: could not allocate {asked} (the machine has no more "
                       f"free){planned}: lower --memory-budget, --batch-size or --seq-len (or free "
                       f"memory) and run again, with --resume if a checkpoint was saved")
