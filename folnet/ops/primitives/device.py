"""Which device's kernel choices a call makes: its tensors' own, or one emulated on the CPU.

folnet picks kernels by device: on a CPU the oneDNN products, the affine-free LayerNorm's
workaround, the keep masks drawn four to a random word, row blocks from T = 256 on, value
checks of the inputs; on CUDA torch's own kernels, the attention backends first, the whole
square, no value check (each would make the host wait for the device). Every one of those
choices asks `kernel_device` rather than reading ``tensor.device.type`` itself, so that
``with emulate("cuda"):`` makes a CPU run take exactly the decisions a CUDA device takes --
what `benchmarks/step_census.py` counts (launching ops, host syncs) as "the CUDA path" on a
machine without one. The tensors stay where they are: only the choices change.

Why a module global and not a context variable: torch.compile reads (and guards on) a global,
while a `contextvars.ContextVar` lookup breaks its graph.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

from folnet.errors import FolnetError, choices

__all__ = ["EMULATED", "emulate", "kernel_device"]

#: The device types `emulate` accepts.
EMULATED = ("cpu", "cuda")
_emulated: str | None = None


def kernel_device(device: torch.device | str) -> str:
    """The device type whose kernel choices a call on ``device`` makes: ``device``'s own type,
    or inside `emulate` the emulated one."""
    if _emulated is not None:
        return _emulated
    return device.type if isinstance(device, torch.device) else torch.device(device).type


@contextmanager
def emulate(device_type: str) -> Iterator[None]:
    """Make every kernel choice inside the block as on ``device_type`` ("cpu" or "cuda"),
    whatever device the tensors are on; the previous setting comes back after it."""
    global _emulated
    if device_type not in EMULATED:
        raise FolnetError(f"emulate: device_type {device_type!r} is unknown; use "
                          f"{choices(EMULATED)}")
    before, _emulated = _emulated, device_type
    try:
        yield
    finally:
        _emulated = before
