"""The Triton kernels of `folnet.ops.primitives.residual_norm`: one pass over the binary stream
for ``y = u + drop(x)`` and ``n = LN(y)`` forward, one for their gradients backward.

Each program takes `rows` rows (pairs) of ``D`` channels: it reads u and x, draws the keep
mask inside the kernel from a seed (Philox, ``tl.rand(seed, offset)``, the offset being the
element's flat index: the backward pass draws the same bits again, so no mask is stored or
read), writes y and n, and one mean and one reciprocal deviation per row. The backward reads
y, the two statistics and the incoming gradients of y and n, and writes the gradients of u
and x. Importing this module needs Triton; `folnet.ops.primitives.residual_norm` imports it only
when Triton imports, and runs it on CUDA tensors (or on CPU tensors under
``TRITON_INTERPRET=1``, which is how the tests run it without a GPU).

Shapes: every tensor is (R, D) rows of pairs, contiguous; the statistics (R,) float32.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

__all__ = ["backward", "forward"]

#: Elements one program holds per tensor (rows x padded channels).
_ELEMENTS = 4096


@triton.jit
def _forward_kernel(U, X, Y, N, MEAN, RSTD, SEED, R, D, p, scale, eps,
                    ROWS: tl.constexpr, BLOCK_D: tl.constexpr, DROP: tl.constexpr):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)  # (ROWS,)
    cols = tl.arange(0, BLOCK_D)  # (BLOCK_D,)
    inside = (rows[:, None] < R) & (cols[None, :] < D)  # (ROWS, BLOCK_D)
    flat = rows[:, None].to(tl.int64) * D + cols[None, :]
    u = tl.load(U + flat, mask=inside, other=0.0).to(tl.float32)
    x = tl.load(X + flat, mask=inside, other=0.0).to(tl.float32)
    if DROP:
        seed = tl.load(SEED)
        keep = tl.rand(seed, flat.to(tl.int32)) >= p
        x = tl.where(keep, x * scale, 0.0)
    y = u + x
    y = y.to(Y.dtype.element_ty)  # as stored: LN's input, what the backward reads
    tl.store(Y + flat, y, mask=inside)
    y = y.to(tl.float32)
    mean = tl.sum(y, axis=1) / D  # (ROWS,)
    centred = tl.where(inside, y - mean[:, None], 0.0)
    rstd = 1.0 / tl.sqrt(tl.sum(centred * centred, axis=1) / D + eps)
    tl.store(N + flat, (centred * rstd[:, None]).to(N.dtype.element_ty), mask=inside)
    tl.store(MEAN + rows, mean, mask=rows < R)
    tl.store(RSTD + rows, rstd, mask=rows < R)


@triton.jit
def _backward_kernel(GY, GN, Y, MEAN, RSTD, SEED, GU, GX, R, D, p, scale,
                     ROWS: tl.constexpr, BLOCK_D: tl.constexpr, DROP: tl.constexpr,
                     HAS_GY: tl.constexpr):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK_D)
    inside = (rows[:, None] < R) & (cols[None, :] < D)
    flat = rows[:, None].to(tl.int64) * D + cols[None, :]
    mean = tl.load(MEAN + rows, mask=rows < R, other=0.0)
    rstd = tl.load(RSTD + rows, mask=rows < R, other=0.0)
    y = tl.load(Y + flat, mask=inside, other=0.0).to(tl.float32)
    gn = tl.load(GN + flat, mask=inside, other=0.0).to(tl.float32)
    normed = tl.where(inside, (y - mean[:, None]) * rstd[:, None], 0.0)
    # LN's backward: rstd (gn - mean(gn) - n mean(gn n)), per row
    along = tl.sum(gn * normed, axis=1) / D
    total = tl.sum(gn, axis=1) / D
    g = rstd[:, None] * (gn - total[:, None] - normed * along[:, None])
    if HAS_GY:
        g += tl.load(GY + flat, mask=inside, other=0.0).to(tl.float32)
    tl.store(GU + flat, g.to(GU.dtype.element_ty), mask=inside)
    if DROP:
        seed = tl.load(SEED)
        keep = tl.rand(seed, flat.to(tl.int32)) >= p
        g = tl.where(keep, g * scale, 0.0)
    tl.store(GX + flat, g.to(GX.dtype.element_ty), mask=inside)


def _tiles(shape: torch.Size) -> tuple[int, int, int, int]:
    """Rows R, channels D, rows per program and padded channels of a (..., D) tensor."""
    d = shape[-1]
    rows = shape.numel() // d
    block_d = triton.next_power_of_2(d)
    return rows, d, max(1, _ELEMENTS // block_d), block_d


def forward(u: torch.Tensor, x: torch.Tensor, seed: torch.Tensor, p: float, eps: float,
            dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
    """u, x (..., D) contiguous, seed (1,) int64 -> y (u's dtype), n (``dtype``), mean and rstd
    (R,) float32."""
    rows, d, per, block_d = _tiles(u.shape)
    y, n = torch.empty_like(u), torch.empty(u.shape, dtype=dtype, device=u.device)
    mean = torch.empty(rows, dtype=torch.float32, device=u.device)
    rstd = torch.empty_like(mean)
    scale = 1.0 / (1.0 - p) if p > 0.0 else 1.0
    _forward_kernel[(triton.cdiv(rows, per),)](u, x, y, n, mean, rstd, seed, rows, d, p, scale,
                                               eps, ROWS=per, BLOCK_D=block_d, DROP=p > 0.0)
    return y, n, mean, rstd


def backward(grad_y: torch.Tensor | None, grad_n: torch.Tensor, y: torch.Tensor,
             mean: torch.Tensor, rstd: torch.Tensor, seed: torch.Tensor, p: float,
             x_dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """The gradients of u (y's dtype) and x (``x_dtype``) from those of y (None: zero) and n."""
    rows, d, per, block_d = _tiles(y.shape)
    grad_u = torch.empty_like(y)
    grad_x = torch.empty(y.shape, dtype=x_dtype, device=y.device)
    scale = 1.0 / (1.0 - p) if p > 0.0 else 1.0
    _backward_kernel[(triton.cdiv(rows, per),)](
        grad_n if grad_y is None else grad_y, grad_n, y, mean, rstd, seed, grad_u, grad_x, rows,
        d, p, scale, ROWS=per, BLOCK_D=block_d, DROP=p > 0.0, HAS_GY=grad_y is not None)
    return grad_u, grad_x
