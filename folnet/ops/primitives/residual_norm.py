"""The binary stream's residual update and the next stage's LayerNorm in one pass:
``y = u + drop(x)``, ``n = LN(y)`` (no affine parameters), over pairs of D2 channels.

Eager, the mixer's update of u2 and the binary FFN's LayerNorm are three passes over the square
forward (dropout, add, norm) and more backward; here they are one custom op
(``folnet::residual_norm``, opaque to torch.compile, which keeps it in its graph) whose CUDA
kernel (`folnet.ops.primitives.triton_residual_norm`, Triton) reads u and x once, writes y and n
once, and draws the dropout's keep mask inside the kernel from a seed -- a one-element tensor
drawn from torch's generator on the device (no host sync) --, so that no mask is stored: the
backward pass (``folnet::residual_norm_backward``, one kernel) draws the same bits again.

Which calls take it is `why_not`'s answer, the way an operator's backends answer
(`folnet.ops.backends.base`): None, or the reason the eager ops run instead -- no Triton on a
CUDA device, a causal layer (its visibility multiplies the stream after the add), a torch.func
transform, a stream too wide or too long for the kernel. On CPU tensors that make CUDA's kernel
choices (`folnet.ops.primitives.device.emulate`: the census, the tests) the op runs its CPU form,
whose keep mask a CPU generator seeded from the same seed draws; under ``TRITON_INTERPRET=1``
CPU tensors run the Triton kernels themselves (tests/ops/test_residual_norm.py). `reference` is
the eager arithmetic every form is tested against.

Shapes: u, x, y, n (..., D) with D = D2; the statistics (R,) float32 for R = numel / D rows.
"""

from __future__ import annotations

import functools
import importlib.util
import os

import torch
import torch.nn.functional as F

from folnet.ops.primitives.device import kernel_device
from folnet.ops.primitives.dropout import native
from folnet.ops.primitives.functorch import transformed

__all__ = ["reference", "residual_norm", "triton_available", "why_not"]

#: The widest row the kernel holds in one program (channels, padded to a power of two).
MAX_WIDTH = 8192
#: Elements the kernel indexes its random offsets with (32-bit).
MAX_ELEMENTS = 1 << 31
_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


@functools.cache
def triton_available() -> bool:
    """Whether Triton is importable (the ``gpu`` extra installs it on Linux x86_64)."""
    return importlib.util.find_spec("triton") is not None


def _interpreted() -> bool:
    """Whether Triton runs its kernels on CPU tensors (its interpreter; the tests)."""
    return os.environ.get("TRITON_INTERPRET") == "1" and triton_available()


def _triton():  # imported when first run: importing Triton costs a second
    from folnet.ops.primitives import triton_residual_norm

    return triton_residual_norm


def why_not(u: torch.Tensor, x: torch.Tensor, *, causal: bool = False, p: float = 0.0
            ) -> str | None:
    """None when ``residual_norm(u, x, p, ...)`` runs the fused op, else why the eager ops
    run."""
    if kernel_device(u.device) != "cuda":
        return "the fused residual norm is CUDA's kernel; a CPU step runs its own kernels"
    if u.device.type == "cuda" and not triton_available():
        return "Triton is not installed (pip install 'folnet[gpu]')"
    if causal:
        return "a causal layer multiplies the stream by its visibility after the add"
    if transformed():
        return "under a torch.func transform the eager ops run"
    if p > 0.0 and not native(u.device):  # the whole square must drop what blocks drop
        return "dropout draws portable keep masks here (portable_masks)"
    if u.shape != x.shape:
        return f"the update's shape {tuple(x.shape)} is not the stream's {tuple(u.shape)}"
    if u.dtype not in _DTYPES or x.dtype not in _DTYPES:
        return f"dtypes {u.dtype}, {x.dtype}: the kernel takes float32, bfloat16 and float16"
    if u.shape[-1] > MAX_WIDTH:
        return f"{u.shape[-1]} channels: the kernel holds at most {MAX_WIDTH} per row"
    if u.numel() >= MAX_ELEMENTS:
        return (f"{u.numel():,} elements: the kernel's random offsets are 32-bit (below "
                f"{MAX_ELEMENTS:,})")
    return None


def reference(u: torch.Tensor, x: torch.Tensor, keep: torch.Tensor | None, p: float,
              eps: float, dtype: torch.dtype | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The eager arithmetic: ``y = u + x * keep / (1 - p)`` in u's dtype, ``n = LN(y)``."""
    if keep is not None:
        x = x * keep / (1.0 - p)
    y = (u + x).to(u.dtype)
    n = F.layer_norm(y.float(), y.shape[-1:], eps=eps)
    return y, n.to(dtype or u.dtype)


def _cpu_keep(shape: torch.Size, seed: torch.Tensor, p: float) -> torch.Tensor:
    """The CPU form's keep mask: drawn by a CPU generator seeded with ``seed``."""
    generator = torch.Generator().manual_seed(int(seed.item()))
    return torch.rand(shape, generator=generator) >= p


def _stats(y: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(R,) float32 mean and reciprocal deviation of y's rows."""
    rows = y.float().reshape(-1, y.shape[-1])
    var, mean = torch.var_mean(rows, dim=-1, correction=0)
    return mean, torch.rsqrt(var + eps)


@torch.library.custom_op("folnet::residual_norm", mutates_args=())
def _forward(u: torch.Tensor, x: torch.Tensor, seed: torch.Tensor, p: float, eps: float,
             dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    if u.device.type == "cuda" or _interpreted():
        return _triton().forward(u, x, seed, p, eps, dtype)
    keep = _cpu_keep(u.shape, seed, p) if p > 0.0 else None
    y, n = reference(u, x, keep, p, eps, dtype)
    return (y, n, *_stats(y, eps))


@_forward.register_fake
def _(u, x, seed, p, eps, dtype):
    rows = u.numel() // u.shape[-1]
    stat = u.new_empty(rows, dtype=torch.float32)
    return torch.empty_like(u), u.new_empty(u.shape, dtype=dtype), stat, torch.empty_like(stat)


@torch.library.custom_op("folnet::residual_norm_backward", mutates_args=())
def _backward(grad_y: torch.Tensor | None, grad_n: torch.Tensor, y: torch.Tensor,
              mean: torch.Tensor,
              rstd: torch.Tensor, seed: torch.Tensor, p: float, x_dtype: torch.dtype
              ) -> tuple[torch.Tensor, torch.Tensor]:
    if y.device.type == "cuda" or _interpreted():
        return _triton().backward(grad_y, grad_n, y, mean, rstd, seed, p, x_dtype)
    d = y.shape[-1]
    normed = (y.float().reshape(-1, d) - mean[:, None]) * rstd[:, None]  # (R, D)
    gn = grad_n.float().reshape(-1, d)
    g = rstd[:, None] * (gn - gn.mean(-1, keepdim=True)
                         - normed * (gn * normed).mean(-1, keepdim=True))
    g = g.reshape(y.shape) if grad_y is None else g.reshape(y.shape) + grad_y.float()
    grad_x = g.clone() if p == 0.0 else g * _cpu_keep(y.shape, seed, p) / (1.0 - p)
    return g.to(y.dtype), grad_x.to(x_dtype)  # an op's outputs never alias each other


@_backward.register_fake
def _(grad_y, grad_n, y, mean, rstd, seed, p, x_dtype):
    return torch.empty_like(y), y.new_empty(y.shape, dtype=x_dtype)


def _setup(ctx, inputs, output) -> None:
    _, x, seed, p, _, _ = inputs
    y, _, mean, rstd = output
    ctx.save_for_backward(y, mean, rstd, seed)
    ctx.p, ctx.x_dtype = p, x.dtype


def _gradients(ctx, grad_y, grad_n, _grad_mean, _grad_rstd):
    y, mean, rstd, seed = ctx.saved_tensors
    if grad_n is None:  # n unread: y's gradient alone
        grad_n = torch.zeros_like(y)
    grad_u, grad_x = _backward(grad_y, grad_n, y, mean, rstd, seed, ctx.p, ctx.x_dtype)
    return grad_u, grad_x, None, None, None, None


_forward.register_autograd(_gradients, setup_context=_setup)


def residual_norm(u: torch.Tensor, x: torch.Tensor, p: float, eps: float,
                  dtype: torch.dtype | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """u, x (..., D) -> (y, n): ``y = u + drop(x)`` at rate ``p`` in u's dtype and ``n = LN(y)``
    in ``dtype`` (None: u's), by the fused op; the caller has asked `why_not` first."""
    # a seed for the in-kernel mask from torch's generator of u's device: seeded runs repeat
    # (none drawn without dropout: an evaluation draws no random number)
    seed = (torch.randint(0, MAX_ELEMENTS - 1, (1,), device=u.device, dtype=torch.int64)
            if p > 0.0 else torch.zeros(1, device=u.device, dtype=torch.int64))
    y, n, _, _ = _forward(u.contiguous(), x.contiguous(), seed, float(p), float(eps),
                          dtype or u.dtype)
    return y, n
