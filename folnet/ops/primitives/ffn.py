"""The binary Boolean stage's CPU kernel, whole or in blocks of query rows: one forward and one
backward, written once.

``out(x, y) = W_o gelu(W_i [n(x, y), n(y, x)] + b_i) + b_o + W_s n(y, x) + b_s`` over the square
(B, T, T, D2). The rows ``x`` of a block read their own row slab ``n(x, :)`` and the column slab
``n(:, x)``; the whole square is the one block of all rows.

What is kept for the backward pass:
* whole: ``n`` and the pre-activation ``h``; the transposed half, the concatenation and
  ``gelu(h)`` are recomputed there -- 2 D2 + F2 channels per pair instead of 4 D2 + 2 F2 (the
  stage is the largest activation of a layer), for one GELU and two copies;
* in blocks (long inputs): ``n`` only; each block's hidden layer is recomputed there, so no
  full-size hidden layer (nor its GELU, nor their gradients) is ever alive: the working set is
  one block's, ``rows / T`` of the whole. Results equal the whole stage up to the order in
  which the weight gradients are summed (float32: ~1e-7 relative). Given ``eps``, ``n`` is the
  stream before its LayerNorm and each block normalises its own two slabs (LayerNorm is per
  pair) in both passes: the normalised square is neither made nor kept -- a layer's FFN stage
  keeps only the stream it reads, which the layer holds anyway.
With a keep mask the output is ``out * keep * scale`` (the residual's dropout, applied block by
block), so that the gradient it receives is the residual's own, not a second full-size tensor.

Under a torch.func transform (``grad``, ``vmap``, ``jacrev``) the same blocks run, but what
eager mode writes in place (the output's rows, the gradients summed over blocks) is built out
of place: under vmap an unbatched buffer cannot take a batched value in place.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F

from folnet.errors import FolnetError
from folnet.ops.primitives.autocast import cast_once
from folnet.ops.primitives.dropout import RowMask, masked_scale
from folnet.ops.primitives.functorch import transformed
from folnet.ops.primitives.linear import mm_linear, onednn_ok, wgrad
from folnet.ops.primitives.norm import layer_norm_backward, layer_norm_stats

__all__ = ["binary_ffn"]


class _Weights(NamedTuple):
    """The stage's parameters: hidden (F2, 2 D2), (F2,); output (D2, F2), (D2,); skip
    (D2, D2), (D2,)."""

    w_in: torch.Tensor
    b_in: torch.Tensor
    w_out: torch.Tensor
    b_out: torch.Tensor
    w_skip: torch.Tensor
    b_skip: torch.Tensor


def _slabs(n: torch.Tensor, r0: int, r1: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows r0:r1 of the square as (n(x, :), n(:, x) transposed): two (B, R, T, D2)."""
    return n[:, r0:r1], n[:, :, r0:r1].transpose(1, 2)


class _Norms(NamedTuple):
    """A block's slabs before their LayerNorm and its statistics: what the backward needs to
    take the gradients through it."""

    own: torch.Tensor
    across: torch.Tensor
    own_stats: tuple[torch.Tensor, torch.Tensor]
    across_stats: tuple[torch.Tensor, torch.Tensor]

    def backward(self, grad_own: torch.Tensor, grad_across: torch.Tensor
                 ) -> tuple[torch.Tensor, torch.Tensor]:
        """The slabs' gradients from those of their normalised forms."""
        return (layer_norm_backward(grad_own, self.own, *self.own_stats),
                layer_norm_backward(grad_across, self.across, *self.across_stats))


def _block(n: torch.Tensor, r0: int, r1: int, eps: float | None, dtype: torch.dtype
           ) -> tuple[torch.Tensor, torch.Tensor, _Norms | None]:
    """The FFN's two inputs for rows r0:r1 (`_slabs`): ``n``'s slabs, or (``eps`` given) those
    slabs normalised and cast to the products' ``dtype``, with what their backward needs."""
    own, across = _slabs(n, r0, r1)
    if eps is None:
        return own, across, None
    y_own, *own_stats = layer_norm_stats(own, eps)  # (B, R, T, D2), (B, R, T, 1) twice
    y_across, *across_stats = layer_norm_stats(across, eps)
    return (y_own.to(dtype), y_across.to(dtype),
            _Norms(own, across, tuple(own_stats), tuple(across_stats)))


def _both(own: torch.Tensor, across: torch.Tensor) -> torch.Tensor:
    """[n(x, y), n(y, x)] for the block's pairs: (P, 2 D2), P = B R T."""
    return torch.cat([own, across], -1).view(-1, 2 * own.shape[-1])


def _summed(total: _Weights | None, more: _Weights, inplace: bool) -> _Weights:
    """Gradients of the weights summed over blocks: into ``total`` in place, or (under a
    torch.func transform) as new tensors."""
    if total is None:
        return more
    return _Weights(*(None if t is None else t.add_(m) if inplace else t + m
                      for t, m in zip(total, more, strict=True)))


def _forward(own: torch.Tensor, across: torch.Tensor, w: _Weights, inplace: bool = True
             ) -> tuple[torch.Tensor, torch.Tensor]:
    """One block's output (P, D2) and pre-activation h (P, F2)."""
    both = _both(own, across)  # (P, 2 D2)
    h = mm_linear(both, w.w_in, w.b_in)  # (P, F2)
    out = mm_linear(F.gelu(h), w.w_out, w.b_out)  # (P, D2)
    skip = both[:, own.shape[-1]:]  # n(y, x)
    if inplace:
        return out.addmm_(skip, w.w_skip.t()).add_(w.b_skip), h
    return out.addmm(skip, w.w_skip.t()) + w.b_skip, h


def _backward(own: torch.Tensor, across: torch.Tensor, h: torch.Tensor | None,
              g: torch.Tensor, w: _Weights, w_t: tuple[torch.Tensor, torch.Tensor]
              ) -> tuple[_Weights, torch.Tensor, torch.Tensor]:
    """One block's backward from its upstream gradient ``g`` (P, D2): the weights' gradients
    (the skip bias's left None: it is the output bias's), those of ``own`` and ``across``
    (their shape). ``h`` is the saved pre-activation, or None to recompute it; ``w_t`` the
    output and hidden weights transposed, made once for every block."""
    w_out_t, w_in_t = w_t
    d2 = own.shape[-1]
    both = _both(own, across)  # (P, 2 D2)
    if h is None:
        h = mm_linear(both, w.w_in, w.b_in)  # (P, F2)
    g_w_out, g_b_out = wgrad(g, F.gelu(h)), g.sum(0)
    grad_h = torch.ops.aten.gelu_backward(mm_linear(g, w_out_t, None), h)  # (P, F2)
    del h
    g_w_in, g_b_in = wgrad(grad_h, both), grad_h.sum(0)
    grad_both = mm_linear(grad_h, w_in_t, None)  # (P, 2 D2)
    del grad_h
    grads = _Weights(g_w_in, g_b_in, g_w_out, g_b_out, wgrad(g, both[:, d2:].contiguous()), None)
    # d/d n(y, x) for the block's x: the hidden layer's second half and the skip Linear
    return (grads, grad_both[:, :d2].view(own.shape),
            grad_both[:, d2:].addmm(g, w.w_skip).view(own.shape))


class _BinaryFFN(torch.autograd.Function):
    """The stage over the square, whole (``rows`` None: the pre-activation saved) or in blocks
    of ``rows`` query rows (every block recomputed). The forward returns the saved
    pre-activation as a second, non-differentiable output (None in blocks): torch.func wants
    what a backward reads to be an input or an output. Plain torch ops throughout under a
    transform, so torch.func generates the vmap rule."""

    generate_vmap_rule = True

    @staticmethod
    def forward(n: torch.Tensor, w_in: torch.Tensor, b_in: torch.Tensor, w_out: torch.Tensor,
                b_out: torch.Tensor, w_skip: torch.Tensor, b_skip: torch.Tensor,
                rows: int | None, keep: torch.Tensor | None, scale: float, eps: float | None,
                redrawn: RowMask | None) -> tuple[torch.Tensor, torch.Tensor | None]:
        w = _Weights(w_in, b_in, w_out, b_out, w_skip, b_skip)
        inplace = not transformed()
        T = n.shape[1]
        if rows is None:  # whole
            out, h = _forward(n, n.transpose(1, 2), w, inplace)
            out = out.view_as(n)  # (B, T, T, D2)
            return (out if keep is None else masked_scale(out, keep, scale)), h
        pieces = []
        out = n.new_empty(n.shape, dtype=w_in.dtype) if inplace else None  # (B, T, T, D2)
        for r0 in range(0, T, rows):
            r1 = min(T, r0 + rows)
            own, across, _ = _block(n, r0, r1, eps, w_in.dtype)  # (B, R, T, D2) each
            piece = _forward(own, across, w, inplace)[0].view(own.shape)
            piece = piece if keep is None else masked_scale(piece, keep[:, r0:r1], scale)
            if inplace:
                out[:, r0:r1] = piece
            else:
                pieces.append(piece)
        return (out if inplace else torch.cat(pieces, 1)), None

    @staticmethod
    def setup_context(ctx, inputs: tuple, output: tuple) -> None:
        n, w_in, b_in, w_out, _, w_skip, _, ctx.rows, keep, ctx.scale, ctx.eps, redrawn = inputs
        h = output[1]
        if h is not None:
            ctx.mark_non_differentiable(h)
        ctx.redrawn = redrawn  # then the backward draws each block's rows of keep again
        ctx.save_for_backward(n, h, w_in, b_in, w_out, w_skip, keep if redrawn is None else None)

    @staticmethod
    def backward(ctx, grad: torch.Tensor, _grad_h: None) -> tuple[torch.Tensor | None, ...]:
        n, h, w_in, b_in, w_out, w_skip, keep = ctx.saved_tensors
        inplace = not transformed()
        w = _Weights(w_in, b_in, w_out, None, w_skip, None)
        d2, T = n.shape[-1], n.shape[1]
        w_t = (w_out.t().contiguous(), w_in.t().contiguous())

        def upstream(r0: int, r1: int) -> torch.Tensor:  # (P, D2), dropped out as the output
            g = grad[:, r0:r1]
            if ctx.redrawn is not None:
                g = masked_scale(g, ctx.redrawn.rows(r0, r1), ctx.scale)
            elif keep is not None:
                g = masked_scale(g, keep[:, r0:r1], ctx.scale)
            return g.reshape(-1, d2)

        if h is not None:  # whole
            grads, grad_own, grad_across = _backward(n, n.transpose(1, 2), h, upstream(0, T), w,
                                                     w_t)
            grad_n = grad_own + grad_across.transpose(1, 2)
        else:
            grads, owns, acrosses = None, [], []
            grad_n = torch.zeros_like(n) if inplace else None
            for r0 in range(0, T, ctx.rows):
                r1 = min(T, r0 + ctx.rows)
                own, across, norms = _block(n, r0, r1, ctx.eps, w_in.dtype)
                got, grad_own, grad_across = _backward(own, across, None, upstream(r0, r1), w,
                                                       w_t)
                del own, across
                if norms is not None:  # through each slab's LayerNorm
                    grad_own, grad_across = norms.backward(grad_own, grad_across)
                grads = _summed(grads, got, inplace)
                if inplace:
                    grad_n[:, r0:r1] += grad_own
                    grad_n[:, :, r0:r1] += grad_across.transpose(1, 2)
                else:  # (B, R, T, D2) each: rows of n's gradient, and of its transpose's
                    owns.append(grad_own)
                    acrosses.append(grad_across)
            if not inplace:
                grad_n = torch.cat(owns, 1) + torch.cat(acrosses, 1).transpose(1, 2)
        return (grad_n, grads.w_in, grads.b_in, grads.w_out, grads.b_out, grads.w_skip,
                grads.b_out, None, None, None, None, None)


def _weights_first(w_in, b_in, w_out, b_out, w_skip, b_skip, n, nt, **options) -> torch.Tensor:
    """`binary_ffn` with the weights first (for `cast_once`, which casts the leading tensors it
    is given: the weights, and the stream too unless its blocks normalise it -- then it is cast
    after its LayerNorm, block by block)."""
    return binary_ffn(n, w_in, b_in, w_out, b_out, w_skip, b_skip, nt=nt, **options)


def binary_ffn(n: torch.Tensor, w_in: torch.Tensor, b_in: torch.Tensor, w_out: torch.Tensor,
               b_out: torch.Tensor, w_skip: torch.Tensor, b_skip: torch.Tensor,
               nt: torch.Tensor | None = None, *, rows: int | None = None,
               keep: torch.Tensor | None = None, p: float = 0.0,
               eps: float | None = None, redrawn: RowMask | None = None) -> torch.Tensor:
    """The binary FFN over ``n`` (B, *tokens, D2). ``nt`` is its transposed input u2(y, x);
    None means ``n.transpose(1, 2)`` (a full square), computed inside -- on the CPU fast path
    with recomputation in the backward. Query rows of a longer domain pass their own ``nt``
    and take plain ops. ``rows`` (a positive integer) runs a full square that many query rows
    at a time, keeping only ``n`` for the backward pass (on CPU and CUDA); there ``keep`` (a
    bool `keep_mask` of n's shape) applies dropout of rate ``p`` to the output, and ``eps``
    (a LayerNorm's epsilon) makes ``n`` the stream before its LayerNorm, which each block
    applies to its own slabs: the FFN of ``layer_norm(n, D2, eps)``, no normalised square
    made or kept. ``redrawn`` (``keep``'s `RowMask`, drawn over these blocks) keeps the
    generator states ``keep`` came from for the backward pass instead of ``keep``."""
    if rows is not None:
        if isinstance(rows, bool) or not isinstance(rows, int) or rows < 1:
            raise FolnetError(f"block rows must be a positive integer, got {rows!r}")
        if n.ndim != 4 or n.shape[1] != n.shape[2] or nt is not None:
            raise FolnetError(f"binary_ffn in blocks of rows needs a full square (B, T, T, D2), "
                              f"got {tuple(n.shape)}" + (" and nt" if nt is not None else ""))
        if redrawn is not None and (keep is None or redrawn.spans != tuple(
                (r0, min(n.shape[1], r0 + rows)) for r0 in range(0, n.shape[1], rows))):
            raise FolnetError(f"binary_ffn: redrawn is keep's row mask over blocks of {rows} "
                              f"rows; got spans {redrawn.spans}"
                              + (" and no keep" if keep is None else ""))
    elif keep is not None or eps is not None or redrawn is not None:
        given = "keep" if keep is not None else "eps" if eps is not None else "redrawn"
        raise FolnetError("binary_ffn applies a keep mask or a LayerNorm (eps) only in blocks "
                          f"of rows; got rows=None with {given}")
    # under autocast: one cast of every input, then plain products in that dtype
    weights, stream = (w_in, b_in, w_out, b_out, w_skip, b_skip), (n, nt)
    cast_out = cast_once(_weights_first, n.device, weights + (stream if eps is None else ()),
                         *(() if eps is None else stream),
                         devices=("cpu", "cuda") if rows is not None else ("cpu",),
                         rows=rows, keep=keep, p=p, eps=eps, redrawn=redrawn)
    if cast_out is not None:
        return cast_out
    if rows is not None or (nt is None and onednn_ok(n, w_in) and n.is_contiguous()):
        scale = 1.0 / (1.0 - p) if keep is not None else 1.0
        return _BinaryFFN.apply(n, w_in, b_in, w_out, b_out, w_skip, b_skip, rows, keep,
                                scale, eps, redrawn)[0]
    if nt is None:
        nt = n.transpose(1, 2)
    hidden = F.gelu(F.linear(torch.cat([n, nt], dim=-1), w_in, b_in))  # (B, *tokens, F2)
    return F.linear(hidden, w_out, b_out) + F.linear(nt, w_skip, b_skip)
