"""Cast once under autocast: the one preamble every hand-written kernel shares.

Why: autocast casts the inputs of each op it knows (matmul, linear, einsum) on every call, and
knows nothing of a custom autograd function. A kernel that runs several products over the same
input (the binary FFN, a folded einsum, a segmented projection, a row-blocked pass) or saves
tensors for its own backward therefore casts every input once, on entry, to the dtype autocast
would use, and runs its body with autocast off -- one cast, and one gradient conversion, where
autocast would make one per product, and a backward in the dtype the forward ran in.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["AutocastState", "autocast_dtype", "cast", "cast_once"]


def autocast_dtype(device: torch.device | str, *, devices: tuple[str, ...] = ("cpu",)
                   ) -> torch.dtype | None:
    """The dtype autocast computes in on ``device`` now, or None when it is off there or the
    device is not one of ``devices`` (the kernels that cast for CUDA too pass
    ``("cpu", "cuda")``)."""
    kind = device if isinstance(device, str) else device.type
    if kind in devices and torch.is_autocast_enabled(kind):
        return torch.get_autocast_dtype(kind)
    return None


def cast(dtype: torch.dtype, *tensors: torch.Tensor | None) -> tuple[torch.Tensor | None, ...]:
    """Every tensor in ``dtype`` (None stays None)."""
    return tuple(None if t is None else t.to(dtype) for t in tensors)


def cast_once(kernel: Callable[..., Any], device: torch.device,
              tensors: tuple[torch.Tensor | None, ...], *rest: Any,
              devices: tuple[str, ...] = ("cpu",), **options: Any) -> Any:
    """``kernel(*tensors, *rest, **options)``; under autocast on ``device`` (one of
    ``devices``) with ``tensors`` cast once to autocast's dtype and autocast off inside, so
    the kernel's products and its saved tensors are all in that dtype. Returns None when
    autocast is off there: the caller then runs its own plain path."""
    dtype = autocast_dtype(device, devices=devices)
    if dtype is None:
        return None
    with torch.autocast(device.type, enabled=False):
        return kernel(*cast(dtype, *tensors), *rest, **options)


@dataclass(frozen=True)
class AutocastState:
    """The autocast state a forward ran under, for a backward that recomputes it (a backward
    runs outside the forward's autocast region)."""

    device_type: str
    enabled: bool
    dtype: torch.dtype

    @classmethod
    def capture(cls, device: torch.device) -> AutocastState | None:
        """The state on ``device`` now (None: a device autocast does not cover)."""
        if device.type not in ("cpu", "cuda"):
            return None
        return cls(device.type, torch.is_autocast_enabled(device.type),
                   torch.get_autocast_dtype(device.type))

    @staticmethod
    def restore(state: AutocastState | None) -> contextlib.AbstractContextManager:
        """A context that runs under ``state`` again (nothing for None)."""
        if state is None:
            return contextlib.nullcontext()
        return torch.autocast(state.device_type, dtype=state.dtype, enabled=state.enabled)
