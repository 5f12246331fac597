"""Mixed precision with `torch.amp`: bf16 or fp16 autocast, and a GradScaler for fp16.

Why only torch.amp: NVIDIA Apex has removed `apex.amp`, and torch's autocast covers
both CUDA and CPU. Parameters and optimiser state stay float32 ("master weights"); only the
forward pass runs in the low-precision type. bf16 has float32's exponent range and needs no
loss scaling; fp16 does, so `make_grad_scaler` returns an enabled scaler only for fp16.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from folnet.errors import FolnetError, choices

__all__ = ["PRECISIONS", "autocast", "check_precision", "make_grad_scaler"]

PRECISIONS = ("fp32", "bf16", "fp16")
_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def check_precision(precision: str, device: torch.device) -> None:
    """Refuse a precision the device cannot run, before any training starts."""
    if precision not in PRECISIONS:
        raise FolnetError(f"precision {precision!r} is unknown; use {choices(PRECISIONS)}")
    if precision == "bf16" and device.type == "cuda" and not torch.cuda.is_bf16_supported():
        raise FolnetError("precision 'bf16' needs a GPU with bfloat16 support (Ampere or "
                          "newer); use --precision fp16 or fp32")


@contextlib.contextmanager
def autocast(precision: str, device: torch.device) -> Iterator[None]:
    """Autocast the enclosed forward pass to the precision's dtype (no-op for fp32)."""
    if precision == "fp32":
        yield
        return
    with torch.autocast(device_type=device.type, dtype=_DTYPES[precision]):
        yield


def make_grad_scaler(precision: str, device: torch.device) -> torch.amp.GradScaler:
    """A dynamic loss scaler for fp16; a disabled one (a pass-through) otherwise.

    Always returning a scaler keeps the training loop branch-free: ``scale``, ``step`` and
    ``update`` of a disabled scaler are plain ``backward``/``optimizer.step``.
    """
    return torch.amp.GradScaler(device.type, enabled=precision == "fp16")
