"""Process-level settings that make FOLNet fast on a CPU.

The binary stream's tensors are tens to hundreds of MiB each (B x T x T x channels). glibc
serves allocations above its mmap threshold (at most 32 MiB) with fresh ``mmap`` pages and
unmaps them on free, so every such tensor is page-faulted and zeroed by the kernel again on
every use: measured here, that made a training step 2-2.5x slower (an exact-GELU pass over
B x T x T x F2 took 32 ms instead of 18). `tune_cpu_allocator` tells glibc to serve everything
from its heap and to keep freed memory for reuse. Freed memory is then not returned to the
operating system until the process ends -- right for a training or benchmark process, which is
why the CLI commands call it and the library does not do it on import.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os

_M_TRIM_THRESHOLD = -1
_M_MMAP_MAX = -4
_M_ARENA_MAX = -8
_done = False


def tune_cpu_allocator() -> bool:
    """Keep large allocations on glibc's heap for reuse. Returns whether it took effect
    (False on non-glibc platforms, or when ``FOLNET_NO_ALLOCATOR_TUNING`` is set)."""
    global _done
    if _done:
        return True
    if os.environ.get("FOLNET_NO_ALLOCATOR_TUNING"):
        return False
    name = ctypes.util.find_library("c")
    if not name:
        return False
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    # One arena: with per-thread arenas and mmap off, allocations made on OpenMP worker
    # threads took a pathological slow path (a tiny model's step went from 0.11 s to 4 s).
    ok = (mallopt(_M_ARENA_MAX, 1) == 1 and mallopt(_M_MMAP_MAX, 0) == 1
          and mallopt(_M_TRIM_THRESHOLD, 1 << 30) == 1)
    _done = ok
    return ok
