"""Process-level settings that make FOLNet fast on a CPU: the allocator, and torch's
deterministic mode set without paying for it when it does not change (`deterministic_algorithms`).

The binary stream's tensors are tens to hundreds of MiB each (B x T x T x channels). glibc
serves allocations above its mmap threshold (at most 32 MiB) with fresh ``mmap`` pages and
unmaps them on free, so every such tensor is page-faulted and zeroed by the kernel again on
every use, which makes a training step much slower (docs/results/measurements.md).
`tune_cpu_allocator` tells glibc to serve everything from its heap and to keep freed memory for
reuse. Freed memory is then not returned to the operating system until the process ends --
right for a training or benchmark process, which is why the CLI commands call it and the
library does not do it on import.

Long sequences are the exception. From `folnet.arch.layer.memory_modes.AUTO_MIN_T` tokens on the
layers run in row blocks: few large tensors (the binary stream, B x T x T x D2), many small
per-block ones, and on one heap the small ones settle into the holes the large ones leave, so
the heap grows well beyond the tensors alive at once (docs/results/measurements.md). A process
told its sequence length (``seq_len``) therefore gives allocations of `LARGE_ALLOCATION` bytes
and more their own pages, returned when freed, as glibc does by default -- the per-block ones
stay on the heap.
"""

from __future__ import annotations

import os

import torch

from folnet.arch.layer.memory_modes import AUTO_MIN_T
from folnet.libc import libc_function, release_free_memory, resident_bytes

# (release_free_memory and resident_bytes live in the leaf `folnet.libc`; importable from here
# too, beside the allocator settings they go with)
__all__ = ["LARGE_ALLOCATION", "deterministic_algorithms", "release_free_memory",
           "resident_bytes", "tune_cpu_allocator"]

_M_TRIM_THRESHOLD = -1
_M_MMAP_MAX = -4
_M_ARENA_MAX = -8
_M_MMAP_THRESHOLD = -3
#: Allocations from this size on get their own pages in a long-sequence process.
LARGE_ALLOCATION = 64 << 20
_done: bool | None = None  # None: not tuned; else whether it was tuned for long sequences


def tune_cpu_allocator(seq_len: int | None = None) -> bool:
    """Keep allocations on glibc's heap for reuse -- below `LARGE_ALLOCATION` bytes only when
    ``seq_len`` (the longest sequence the process runs) reaches `AUTO_MIN_T`. Returns whether
    it took effect (False on non-glibc platforms, or when ``FOLNET_NO_ALLOCATOR_TUNING`` is
    set). Calling it again with another length retunes."""
    global _done
    long = seq_len is not None and seq_len >= AUTO_MIN_T
    if _done is long:
        return True
    if os.environ.get("FOLNET_NO_ALLOCATOR_TUNING"):
        return False
    mallopt = libc_function("mallopt")
    if mallopt is None:
        return False
    # One arena: with per-thread arenas and mmap off, allocations made on OpenMP worker
    # threads take a pathological slow path, many times slower (docs/results/measurements.md).
    if long:
        pages = (mallopt(_M_MMAP_THRESHOLD, LARGE_ALLOCATION) == 1
                 and mallopt(_M_MMAP_MAX, 1 << 24) == 1)
    else:
        pages = mallopt(_M_MMAP_MAX, 0) == 1
    ok = pages and mallopt(_M_ARENA_MAX, 1) == 1 and mallopt(_M_TRIM_THRESHOLD, 1 << 30) == 1
    _done = long if ok else None
    return ok


def deterministic_algorithms(enabled: bool, warn_only: bool = False) -> None:
    """``torch.use_deterministic_algorithms(enabled, warn_only=warn_only)``, skipped when torch
    is in that mode already: torch's first call imports its compiler stack, a start-up cost
    (docs/results/measurements.md) that every `folnet pretrain` and every seed process of
    ``folnet ablate --jobs`` would pay to set the default it already has."""
    now = (torch.are_deterministic_algorithms_enabled(),
           torch.is_deterministic_algorithms_warn_only_enabled())
    if now[0] == enabled and (not enabled or now[1] == warn_only):
        return
    torch.use_deterministic_algorithms(enabled, warn_only=warn_only)
