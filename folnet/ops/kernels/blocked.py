"""The binary Boolean FFN evaluated in blocks of query rows (a first piece of the row-blocked
binary stream for long sequences).

Over a full square the stage reads ``[u2(x, y), u2(y, x)]`` for every pair, so its hidden layer
is B x T x T x F2 -- at F2 = 4 D2 the largest tensor of a layer. Row by row nothing else is
needed: the rows ``x`` of a block read their own row slab ``u2(x, :)`` and the column slab
``u2(:, x)``. `blocked_binary_ffn` runs the stage one block of rows at a time, keeps only its
input for the backward pass and recomputes each block's hidden layer there, so no full-size
hidden layer (nor its GELU, nor their gradients) is ever alive: the stage's working set is one
block's, ``rows / T`` of the full one. Results equal the unblocked stage up to the order in which
the weight gradients are summed (float32: ~1e-7 relative).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from folnet.errors import FolnetError

__all__ = ["blocked_binary_ffn"]


def _block(n: torch.Tensor, r0: int, r1: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows r0:r1 of the square as (u2(x, :), u2(:, x) transposed): two (B, R, T, D2)."""
    return n[:, r0:r1], n[:, :, r0:r1].transpose(1, 2)


class _BlockedBinaryFFN(torch.autograd.Function):
    """``out = W_o gelu(W_i [n, n^T] + b_i) + b_o + W_s n^T + b_s``, block by block."""

    @staticmethod
    def forward(ctx, n, w_in, b_in, w_out, b_out, w_skip, b_skip, rows):
        out = torch.empty_like(n)  # (B, T, T, D2)
        for r0 in range(0, n.shape[1], rows):
            r1 = min(n.shape[1], r0 + rows)
            own, across = _block(n, r0, r1)  # (B, R, T, D2) each
            hidden = F.gelu(F.linear(torch.cat([own, across], -1), w_in, b_in))  # (B, R, T, F2)
            out[:, r0:r1] = F.linear(hidden, w_out, b_out) + F.linear(across, w_skip, b_skip)
        ctx.save_for_backward(n, w_in, b_in, w_out, w_skip)
        ctx.rows = rows
        return out

    @staticmethod
    def backward(ctx, grad):
        n, w_in, b_in, w_out, w_skip = ctx.saved_tensors
        d2 = n.shape[-1]
        grad_n = torch.zeros_like(n)
        grad_w_in, grad_b_in = torch.zeros_like(w_in), torch.zeros_like(b_in)
        grad_w_out, grad_w_skip = torch.zeros_like(w_out), torch.zeros_like(w_skip)
        grad_b = torch.zeros_like(w_out[:, 0])
        for r0 in range(0, n.shape[1], ctx.rows):
            r1 = min(n.shape[1], r0 + ctx.rows)
            own, across = _block(n, r0, r1)
            both = torch.cat([own, across], -1).flatten(0, -2)  # (P, 2 D2), P = B R T
            h = F.linear(both, w_in, b_in)  # (P, F2) recomputed
            g = grad[:, r0:r1].reshape(-1, d2)  # (P, D2)
            grad_w_out += g.t() @ F.gelu(h)
            grad_b += g.sum(0)
            grad_h = torch.ops.aten.gelu_backward(g @ w_out, h)  # (P, F2)
            grad_w_in += grad_h.t() @ both
            grad_b_in += grad_h.sum(0)
            grad_both = grad_h @ w_in  # (P, 2 D2)
            flat_across = across.reshape(-1, d2)
            grad_w_skip += g.t() @ flat_across
            shape = own.shape  # (B, R, T, D2)
            grad_n[:, r0:r1] += grad_both[:, :d2].view(shape)
            # d/d u2(y, x) for the block's x: the FFN's second half and the skip Linear
            grad_across = grad_both[:, d2:].addmm(g, w_skip).view(shape)
            grad_n[:, :, r0:r1] += grad_across.transpose(1, 2)
        return grad_n, grad_w_in, grad_b_in, grad_w_out, grad_b, grad_w_skip, grad_b, None


def blocked_binary_ffn(n: torch.Tensor, w_in: torch.Tensor, b_in: torch.Tensor,
                       w_out: torch.Tensor, b_out: torch.Tensor, w_skip: torch.Tensor,
                       b_skip: torch.Tensor, rows: int) -> torch.Tensor:
    """The binary FFN over a full square ``n`` (B, T, T, D2), ``rows`` query rows at a time
    (a positive integer; ``rows >= T`` is one block)."""
    if isinstance(rows, bool) or not isinstance(rows, int) or rows < 1:
        raise FolnetError(f"block rows must be a positive integer, got {rows!r}")
    if n.ndim != 4 or n.shape[1] != n.shape[2]:
        raise FolnetError(f"blocked_binary_ffn needs a full square (B, T, T, D2), got "
                         f"{tuple(n.shape)}")
    device = n.device.type
    # under autocast: one cast of every input, then plain products in that dtype
    if device in ("cpu", "cuda") and torch.is_autocast_enabled(device):
        dtype = torch.get_autocast_dtype(device)
        with torch.autocast(device, enabled=False):
            return blocked_binary_ffn(*(t.to(dtype) for t in (n, w_in, b_in, w_out, b_out,
                                                               w_skip, b_skip)), rows=rows)
    return _BlockedBinaryFFN.apply(n, w_in, b_in, w_out, b_out, w_skip, b_skip, rows)
