"""Matrix products for the binary stream's big activations on the CPU.

The binary stream's products are tall and thin (B*T*T rows, tens of columns). On the CPU tried,
oneDNN runs them faster than the default BLAS, and a weight gradient over 10^5 rows runs
faster cut into one slice per thread (`wgrad`; docs/results/measurements.md).
`segmented_linear` projects one input onto several row-segments of a weight, each in the layout
its consumer wants, with a backward that accumulates into one input gradient. Everything falls
back to plain ``F.linear`` off the CPU fast path (other devices, dtypes oneDNN lacks here,
torch.compile tracing, torch.func transforms). The autograd Functions compose with torch.func
(``grad``, ``vmap``, ``jacrev``): their gradients are built out of place under a transform
(`folnet.ops.primitives.functorch`).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from folnet.ops.primitives.autocast import cast_once
from folnet.ops.primitives.device import kernel_device
from folnet.ops.primitives.functorch import transformed


def _onednn_linear_op():
    """torch's oneDNN linear (``x @ w.T + b``) when this build has it, else None."""
    try:
        op = torch.ops.mkldnn._linear_pointwise
    except (AttributeError, RuntimeError):
        return None
    return op if torch.backends.mkldnn.is_available() else None


_ONEDNN = _onednn_linear_op()


def _onednn_bf16() -> bool:
    """Whether oneDNN has bf16 kernels on this CPU (AVX-512 BF16 / AMX). Without them its
    bf16 inner product refuses to build a primitive ("could not create a primitive
    descriptor"), so bf16 products take the plain ``F.linear`` path."""
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


_ONEDNN_DTYPES = (torch.float32, torch.bfloat16) if _onednn_bf16() else (torch.float32,)


def _register_flops() -> None:
    """Teach torch.utils.flop_counter the oneDNN linear (2 * rows * in * out), so benchmarks and
    `folnet info` count the products that run through it."""
    if _ONEDNN is None:
        return
    from torch.utils.flop_counter import register_flop_formula

    try:
        @register_flop_formula(torch.ops.mkldnn._linear_pointwise)
        def _flops(x_shape, w_shape, *args, out_shape=None, **kwargs) -> int:
            rows = 1
            for n in x_shape[:-1]:
                rows *= n
            return 2 * rows * x_shape[-1] * w_shape[0]
    except (RuntimeError, ValueError):  # already registered (module reloaded)
        pass


_register_flops()


def tracing() -> bool:
    """True while torch.compile traces: inductor lowers oneDNN's linear only for constant
    (frozen) weights, so the traced graph gets plain ops, which it fuses on its own."""
    return torch.compiler.is_compiling()


def onednn_ok(x: torch.Tensor, w: torch.Tensor) -> bool:
    """Whether ``x @ w.T`` may run on oneDNN: CPU, a dtype it has here, not while tracing nor
    under a torch.func transform (its linear has no batching rule nor derivative formula)."""
    return (_ONEDNN is not None and kernel_device(x.device) == "cpu" and x.dtype == w.dtype
            and x.dtype in _ONEDNN_DTYPES and x.shape[-1] > 0
            and not tracing() and not transformed())


def wgrad(g2: torch.Tensor, x2: torch.Tensor) -> torch.Tensor:
    """``g2.T @ x2`` for a weight gradient: (P, C) and (P, D) -> (C, D), P in the 10^5s.

    The BLAS runs this reduction over a huge inner dimension well below its usual rate (a
    transposed operand and one output tile shared by all threads). Cutting P into one slice per
    thread and summing the slices' products (a batched GEMM) is faster in float32 for the binary
    stream's shapes (docs/results/measurements.md).
    """
    rows = g2.shape[0]
    k = torch.get_num_threads()
    if kernel_device(g2.device) != "cpu" or k < 2 or rows < 8192 or rows % k or \
            g2.dtype != torch.float32:
        return g2.t().mm(x2)
    # (k, C, P/k) @ (k, P/k, D) -> (k, C, D) -> (C, D)
    return torch.bmm(g2.view(k, rows // k, -1).transpose(1, 2),
                     x2.view(k, rows // k, -1)).sum(0)


def mm_linear(x2: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    if onednn_ok(x2, w):
        return _ONEDNN(x2, w, b, "none", [], "")
    return F.linear(x2, w, b)


class _Linear(torch.autograd.Function):
    """``x @ w.T + b`` with the two products that read the big activation (the forward and
    the input gradient) on oneDNN, faster than the default BLAS on the binary stream's
    tall-and-thin shapes (B*T*T rows, tens of columns; docs/results/measurements.md). Plain
    products under vmap, so torch.func generates its vmap rule."""

    generate_vmap_rule = True

    @staticmethod
    def forward(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
        x2 = x.reshape(-1, x.shape[-1])  # (P, D)
        return mm_linear(x2, w, b).view(*x.shape[:-1], w.shape[0])  # (..., C)

    @staticmethod
    def setup_context(ctx, inputs: tuple, output: torch.Tensor) -> None:
        x, w, b = inputs
        ctx.save_for_backward(x, w)
        ctx.has_bias = b is not None

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        x, w = ctx.saved_tensors
        g2 = grad.reshape(-1, grad.shape[-1])  # (P, C)
        grad_x = grad_w = grad_b = None
        if ctx.needs_input_grad[0]:
            grad_x = mm_linear(g2, w.t().contiguous(), None).view_as(x)
        if ctx.needs_input_grad[1]:
            grad_w = wgrad(g2, x.reshape(-1, x.shape[-1]))
        if ctx.has_bias and ctx.needs_input_grad[2]:
            grad_b = g2.sum(0)
        return grad_x, grad_w, grad_b


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None):
    """``F.linear`` for the binary stream's big activations: oneDNN on CPU for float32 and
    bfloat16 (autocast included), plain ``F.linear`` everywhere else."""
    cast_out = cast_once(linear, x.device, (x, weight, bias))
    if cast_out is not None:
        return cast_out
    if not onednn_ok(x, weight) or not x.is_contiguous():
        return F.linear(x, weight, bias)
    return _Linear.apply(x, weight, bias)


# -- one projection, many consumers ------------------------------------------------------------


class _SegmentedLinear(torch.autograd.Function):
    """The projection of the binary stream ``x`` (B, *tokens, D) -- (B, T, T, D) for the full
    square, (B, Q, n, D) for query rows -- onto several row-segments of one weight, each
    returned as its own tensor in the layout its consumer wants:

    * ``"cl"``: channels last (B, *tokens, C), on oneDNN;
    * ``"cf"``: channels first (B, C, *tokens), a batched GEMM -- softmaxes then run over a
      contiguous axis and the T x T products need no transposed copies.

    Unlike a fused projection followed by ``split`` (whose backward concatenates the segment
    gradients into one B x T x T x N tensor) or slicing (whose backward zero-fills one such
    tensor per slice), the backward accumulates each segment's contribution straight into the
    input gradient -- in place in eager mode, out of place under a torch.func transform (which
    generates the vmap rule).
    """

    generate_vmap_rule = True

    @staticmethod
    def forward(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                segments: tuple[tuple[int, int, str], ...]) -> tuple[torch.Tensor, ...]:
        B, tokens, D = x.shape[0], tuple(x.shape[1:-1]), x.shape[-1]
        P = math.prod(tokens)  # token pairs per sequence
        x2 = x.reshape(-1, D)  # (B*P, D)
        outs = []
        for start, width, layout in segments:
            w = weight[start : start + width]
            b = None if bias is None else bias[start : start + width]
            if layout == "cl":
                outs.append(mm_linear(x2, w, b).view(B, *tokens, width))
            else:  # (C, D) @ (B, D, P) -> (B, C, P)
                xt = x.reshape(B, P, D).transpose(1, 2)
                if b is None:
                    out = torch.matmul(w, xt)
                else:
                    out = torch.baddbmm(b[None, :, None].expand(B, width, P),
                                        w.expand(B, width, D), xt)
                outs.append(out.view(B, width, *tokens))
        return tuple(outs)

    @staticmethod
    def setup_context(ctx, inputs: tuple, output: tuple) -> None:
        x, weight, bias, ctx.segments = inputs
        ctx.save_for_backward(x, weight)
        ctx.has_bias = bias is not None

    @staticmethod
    def backward(ctx, *grads: torch.Tensor | None) -> tuple[torch.Tensor | None, ...]:
        x, weight = ctx.saved_tensors
        inplace = not transformed()
        B, D = x.shape[0], x.shape[-1]
        P = math.prod(x.shape[1:-1])
        x2 = x.reshape(-1, D)
        grad_x = None  # (B*P, D)
        grad_w = torch.zeros_like(weight)
        grad_b = weight.new_zeros(weight.shape[0]) if ctx.has_bias else None
        for (start, width, layout), g in zip(ctx.segments, grads, strict=True):
            if g is None:
                continue
            w = weight[start : start + width]
            if layout == "cl":
                g2 = g.reshape(-1, width)  # (B*P, C)
                if grad_x is None:
                    grad_x = mm_linear(g2, w.t().contiguous(), None)
                else:
                    grad_x = grad_x.addmm_(g2, w) if inplace else grad_x.addmm(g2, w)
                gw = wgrad(g2, x2)
                gb = g2.sum(0) if grad_b is not None else None
            else:
                g3 = g.reshape(B, width, P)  # (B, C, P)
                if grad_x is None:
                    grad_x = torch.matmul(g3.transpose(1, 2), w).reshape(-1, D)
                else:  # (B, P, D) += (B, P, C) @ (B, C, D)
                    gx, w3 = grad_x.view(B, P, D), w.expand(B, width, D)
                    gx = (gx.baddbmm_(g3.transpose(1, 2), w3) if inplace
                          else gx.baddbmm(g3.transpose(1, 2), w3))
                    grad_x = gx.view(-1, D)
                gw = torch.matmul(g3, x.reshape(B, P, D)).sum(0)
                # two sums: in bf16 much faster than one over (0, 2)
                # (docs/results/measurements.md)
                gb = g3.sum(2).sum(0) if grad_b is not None else None
            grad_w = _put(grad_w, start, gw, inplace)
            if gb is not None:
                grad_b = _put(grad_b, start, gb, inplace)
        if grad_x is not None:
            grad_x = grad_x.view_as(x)
        return grad_x, grad_w, grad_b, None


def _put(total: torch.Tensor, start: int, rows: torch.Tensor, inplace: bool) -> torch.Tensor:
    """``total`` with rows start:start+len(rows) set to ``rows``: written in place, or (under
    a torch.func transform, where ``total`` may be unbatched and ``rows`` batched) a new
    tensor."""
    if inplace:
        total[start : start + rows.shape[0]] = rows
        return total
    return total.slice_scatter(rows, 0, start, start + rows.shape[0])


def segmented_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                     segments: tuple[tuple[int, int, str], ...]) -> tuple[torch.Tensor, ...]:
    """Project ``x`` (B, *tokens, D) onto the ``(start, width, "cl"|"cf")`` row segments of
    ``weight``; see `_SegmentedLinear`. Falls back to plain ops off the CPU fast path."""
    cast_out = cast_once(segmented_linear, x.device, (x, weight, bias), segments)
    if cast_out is not None:
        return cast_out
    if kernel_device(x.device) != "cpu" or not x.is_contiguous() or tracing():
        outs = []
        for start, width, layout in segments:
            b = None if bias is None else bias[start : start + width]
            y = F.linear(x, weight[start : start + width], b)  # (B, *tokens, C)
            outs.append(y if layout == "cl" else y.movedim(-1, 1))
        return tuple(outs)
    return _SegmentedLinear.apply(x, weight, bias, segments)
