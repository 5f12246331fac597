"""LayerNorm without affine parameters -- every LayerNorm of a FOLNet -- at the speed of the
affine one.

Why: ATen's CPU LayerNorm runs a slower kernel when it has no weight and bias, so the CPU
call passes a weight of ones and a bias of zeros (docs/results/measurements.md). ``x * 1 + 0``
is exact, so outputs and input gradients are the same bits, in every dtype and under both CPU
kernel sets the suite runs (tests/ops/test_norm.py). On other devices the plain call stays:
only CPU timings back the change.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from folnet.ops.primitives.device import kernel_device

__all__ = ["layer_norm", "layer_norm_backward", "layer_norm_stats"]


def layer_norm(x: torch.Tensor, width: int, eps: float) -> torch.Tensor:
    """``F.layer_norm(x, (width,), eps=eps)``: x (..., width) normalised over its last dim."""
    if kernel_device(x.device) != "cpu":
        return F.layer_norm(x, (width,), eps=eps)
    # (width,) each: constants, never trained (no gradient is asked of them)
    return F.layer_norm(x, (width,), x.new_ones(width), x.new_zeros(width), eps)


def layer_norm_stats(x: torch.Tensor, eps: float
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`layer_norm` over x's last dim with the statistics its backward reads: (y, mean, rstd),
    the statistics (..., 1). For a kernel that differentiates a normalisation by hand (the
    binary FFN's blocks, `folnet.ops.primitives.ffn`): the same ATen kernel with a weight of ones
    and a bias of zeros, so ``y`` holds `layer_norm`'s bits on a CPU."""
    width = x.shape[-1]
    return torch.native_layer_norm(x, [width], x.new_ones(width), x.new_zeros(width), eps)


def layer_norm_backward(grad: torch.Tensor, x: torch.Tensor, mean: torch.Tensor,
                        rstd: torch.Tensor) -> torch.Tensor:
    """The gradient towards x of `layer_norm_stats`' y, from y's gradient ``grad`` (cast to x's
    dtype first) and the statistics that call returned."""
    width = x.shape[-1]
    return torch.ops.aten.native_layer_norm_backward(
        grad.to(x.dtype), x, [width], mean, rstd, x.new_ones(width), x.new_zeros(width),
        [True, False, False])[0]
