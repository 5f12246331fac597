"""glibc, asked through ctypes: the process's resident memory and its allocator's free pages.

A leaf module (it imports nothing from folnet) so that both the process settings
(`folnet.runtime`) and the layers (`folnet.arch.layer.row_blocks`, whose ``"tight"`` memory mode
returns the heap's free pages around each recomputed stage) can use it. Off glibc every
function here is a no-op that says so.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os

__all__ = ["libc_function", "release_free_memory", "resident_bytes"]


@functools.cache
def libc_function(name: str):
    """glibc's ``name`` (None off glibc), looked up once: `ctypes.util.find_library` runs
    ldconfig in a subprocess, too slow to repeat between training steps."""
    library = ctypes.util.find_library("c")
    if not library:
        return None
    try:
        return getattr(ctypes.CDLL(library), name)
    except (OSError, AttributeError):
        return None


def resident_bytes() -> int | None:
    """This process's resident memory now (Linux ``/proc/self/statm``), or None elsewhere."""
    try:
        pages = int(open("/proc/self/statm", encoding="ascii").read().split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return pages * os.sysconf("SC_PAGE_SIZE")


def release_free_memory() -> bool:
    """Hand the heap's free pages back to the operating system (glibc ``malloc_trim``).

    Why it exists: with the heap kept (`folnet.runtime.tune_cpu_allocator`), freed blocks are
    reused, but the holes that tensors of different sizes leave grow the heap step after
    step (docs/results/measurements.md). A run that must stay inside a memory budget calls
    this when its resident memory passes the budget: the next step faults the returned pages
    in again (a cost paid only then). The ``"tight"`` memory mode (`folnet.arch.layer.memory_modes`)
    calls it before and after each recomputed mixer stage's backward pass. Returns whether
    anything could be asked (False off glibc)."""
    trim = libc_function("malloc_trim")
    if trim is None:
        return False
    trim(0)
    return True
