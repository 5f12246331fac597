"""Cast once under autocast: the one preamble every hand-written kernel shares.

Why: autocast casts the inputs of each op it knows (matmul, linear, einsum) on every call, and
knows nothing of a custom autograd function. A kernel that runs several products over the same
input (the binary FFN, a folded einsum, a segmented projection, a row-blocked pass) or saves
tensors for its own backward therefore casts every input once, on entry, to the dtype autocast
would use, and runs its body with autocast off -- one cast, and one gradient conversion, where
autocast would make one per product, and a backward in the dtype the forward ran in.
"""

from __future__ import annotations

import torch

__all__ = ["autocast_dtype", "cast"]


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
