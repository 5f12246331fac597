"""`folnet.libc`: the heap release the ``"tight"`` memory mode and memory budgets use really
returns freed pages to the operating system on glibc, and `folnet.runtime` still exports it."""

from __future__ import annotations

import ctypes.util
import platform
import subprocess
import sys

import pytest

import folnet.runtime
from folnet.libc import libc_function, release_free_memory, resident_bytes

glibc = pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc"
                           or ctypes.util.find_library("c") is None,
                           reason="glibc's malloc_trim and /proc/self/statm: Linux with glibc only")


def test_runtime_exports_the_same_functions():
    assert folnet.runtime.release_free_memory is release_free_memory
    assert folnet.runtime.resident_bytes is resident_bytes
    assert libc_function("no_such_function_in_libc") is None


#: Run in a process of its own: it changes glibc's settings for the whole process.
_FREED_PAGES = """
import torch
from folnet.libc import libc_function, release_free_memory, resident_bytes
mallopt = libc_function("mallopt")
# everything on the heap, its top never trimmed by itself: as the training commands set it for
# short sequences (folnet.runtime.tune_cpu_allocator)
assert mallopt(-4, 0) == 1 and mallopt(-1, 1 << 30) == 1  # M_MMAP_MAX, M_TRIM_THRESHOLD
pieces = [torch.ones(1 << 18) for _ in range(256)]  # 256 x 1 MiB, each touched
keep = torch.ones(1 << 10)  # allocated above them: the heap's top stays
del pieces
freed = resident_bytes()
assert release_free_memory() is True
after = resident_bytes()
assert keep.sum().item() == 1 << 10
print(freed - after)
"""


@glibc
def test_release_returns_freed_heap_pages():
    """Tensors freed below a live one stay resident until released: the release gives most
    of them back to the operating system."""
    proc = subprocess.run([sys.executable, "-c", _FREED_PAGES], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    returned = int(proc.stdout.split()[-1])
    assert returned > 128 << 20, f"{returned / 2**20:.0f} MiB returned of 256 MiB freed"
