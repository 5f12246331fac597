"""The binary Boolean stage's CPU kernel: ``[u2(x,y), u2(y,x)] -> Linear -> GELU -> Linear``
plus a skip Linear of ``u2(y,x)``, saving little for the backward pass.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from folnet.ops.kernels.autocast import autocast_dtype, cast
from folnet.ops.kernels.linear import mm_linear, onednn_ok, wgrad


class _BinaryFFN(torch.autograd.Function):
    """``out = W_o gelu(W_i [n, n^T] + b_i) + b_o + W_s n^T + b_s`` over (B, T, T, D2).

    Saves only the normalised stream ``n`` and the pre-activation ``h`` for the backward pass
    and recomputes the transposed copy, the concatenation and ``gelu(h)`` there: 2 D2 + F2
    channels per pair instead of 4 D2 + 2 F2 (the stage is the largest activation of a
    layer), at the price of one GELU and two copies.
    """

    @staticmethod
    def forward(ctx, n, w_in, b_in, w_out, b_out, w_skip, b_skip):
        nt = n.transpose(1, 2).contiguous()  # (B, T, T, D2) n(y, x)
        both = torch.cat([n, nt], dim=-1)  # (B, T, T, 2 D2)
        h = mm_linear(both.view(-1, both.shape[-1]), w_in, b_in)  # (P, F2)
        out = mm_linear(F.gelu(h), w_out, b_out)  # (P, D2)
        out.addmm_(nt.view(-1, nt.shape[-1]), w_skip.t()).add_(b_skip)
        ctx.save_for_backward(n, h, w_in, w_out, w_skip)
        return out.view_as(n)

    @staticmethod
    def backward(ctx, grad):
        n, h, w_in, w_out, w_skip = ctx.saved_tensors
        d2 = n.shape[-1]
        nt = n.transpose(1, 2).contiguous()
        both = torch.cat([n, nt], dim=-1).view(-1, 2 * d2)  # recomputed (P, 2 D2)
        g = grad.reshape(-1, d2)  # (P, D2)
        grad_w_out = wgrad(g, F.gelu(h))
        grad_b = g.sum(0)
        grad_h = torch.ops.aten.gelu_backward(mm_linear(g, w_out.t().contiguous(), None), h)
        grad_w_in = wgrad(grad_h, both)
        grad_b_in = grad_h.sum(0)
        grad_both = mm_linear(grad_h, w_in.t().contiguous(), None)  # (P, 2 D2)
        grad_w_skip = wgrad(g, nt.view(-1, d2))
        grad_nt = grad_both[:, d2:].addmm(g, w_skip).view_as(n)  # d/d n(y, x)
        grad_n = grad_both[:, :d2].view_as(n) + grad_nt.transpose(1, 2)
        return grad_n, grad_w_in, grad_b_in, grad_w_out, grad_b, grad_w_skip, grad_b


def binary_ffn(n: torch.Tensor, w_in: torch.Tensor, b_in: torch.Tensor, w_out: torch.Tensor,
               b_out: torch.Tensor, w_skip: torch.Tensor, b_skip: torch.Tensor,
               nt: torch.Tensor | None = None) -> torch.Tensor:
    """The binary FFN over ``n`` (B, *tokens, D2). ``nt`` is its transposed input u2(y, x);
    None means ``n.transpose(1, 2)`` (a full square), computed inside -- on the CPU fast path
    with recomputation in the backward. Query rows of a longer domain pass their own ``nt``
    and take plain ops."""
    dtype = autocast_dtype(n.device)
    if dtype is not None:
        with torch.autocast("cpu", enabled=False):
            return binary_ffn(*cast(dtype, n, w_in, b_in, w_out, b_out, w_skip, b_skip),
                              nt=cast(dtype, nt)[0])
    if nt is None and onednn_ok(n, w_in) and n.is_contiguous():
        return _BinaryFFN.apply(n, w_in, b_in, w_out, b_out, w_skip, b_skip)
    if nt is None:
        nt = n.transpose(1, 2)
    hidden = F.gelu(F.linear(torch.cat([n, nt], dim=-1), w_in, b_in))  # (B, *tokens, F2)
    return F.linear(hidden, w_out, b_out) + F.linear(nt, w_skip, b_skip)
