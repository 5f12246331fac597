"""Elementwise kernels for the binary stream's hot path: cheaper dropout on the CPU.

``F.dropout`` draws one float per element through ``bernoulli_``; on a 2-core CPU that is ~50x
the cost of an add, and the binary stream (B x T x T x D2) gets dropout twice per layer. Here the
keep mask comes from 64-bit random words cut into four 15-bit lanes (one RNG call per four
elements) compared against ``p * 2**15``; the mask is stored as bool (1 byte per element) for the
backward pass. The draw uses torch's default generator, so seeding and RNG-state checkpoints
cover it. On CUDA the native kernels are already fast and are used as they are.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

_LANES = 4  # 15-bit lanes per 64-bit random word
_LEVELS = 1 << 15


def keep_mask(shape: torch.Size | tuple[int, ...], p: float, device) -> torch.Tensor:
    """A bool tensor of ``shape`` that is True with probability ``1 - p`` (quantised to 2^-15)."""
    n = 1
    for s in shape:
        n *= s
    words = torch.empty(-(-n // _LANES), dtype=torch.int64, device=device).random_()
    lanes = words.view(torch.int16)[:n].bitwise_and(_LEVELS - 1)  # 15 random bits each
    return (lanes >= round(p * _LEVELS)).view(shape)


def _masked_scale(x: torch.Tensor, mask: torch.Tensor, scale: float) -> torch.Tensor:
    """``x * mask * scale`` in x's dtype; ``where`` + an in-place scale measured ~15% faster
    than the two products (no float copy of the bool mask)."""
    return torch.where(mask, x, 0.0).mul_(scale)


class _MaskedScale(torch.autograd.Function):
    """``x * mask * scale`` saving only the bool mask."""

    @staticmethod
    def forward(ctx, x, mask, scale):
        ctx.save_for_backward(mask)
        ctx.scale = scale
        return _masked_scale(x, mask, scale)

    @staticmethod
    def backward(ctx, grad):
        (mask,) = ctx.saved_tensors
        return _masked_scale(grad, mask, ctx.scale), None, None


class _DropoutAdd(torch.autograd.Function):
    """``residual + dropout(x)`` in one pass, saving only the bool mask."""

    @staticmethod
    def forward(ctx, residual, x, mask, scale):
        ctx.save_for_backward(mask)
        ctx.scale = scale
        ctx.x_dtype = x.dtype
        return torch.addcmul(residual, x, mask, value=scale)

    @staticmethod
    def backward(ctx, grad):
        (mask,) = ctx.saved_tensors
        # in the update's dtype (bf16 under autocast) straight away, not via a float copy
        return grad, _masked_scale(grad, mask, ctx.scale).to(ctx.x_dtype), None, None


def dropout(x: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    """Inverted dropout; the cheap mask on CPU, ``F.dropout`` elsewhere."""
    if not training or p == 0.0:
        return x
    if x.device.type != "cpu":
        return F.dropout(x, p, True)
    return _MaskedScale.apply(x, keep_mask(x.shape, p, x.device), 1.0 / (1.0 - p))


def dropout_add(residual: torch.Tensor, x: torch.Tensor, p: float,
                training: bool) -> torch.Tensor:
    """``residual + dropout(x)``: the residual update of every stage."""
    if not training or p == 0.0:
        return residual + x
    if x.device.type != "cpu":
        return residual + F.dropout(x, p, True)
    mask = keep_mask(torch.broadcast_shapes(residual.shape, x.shape), p, x.device)
    return _DropoutAdd.apply(residual, x, mask, 1.0 / (1.0 - p))


# -- oneDNN matrix products ----------------------------------------------------------------------


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


def _tracing() -> bool:
    """True while torch.compile traces: inductor lowers oneDNN's linear only for constant
    (frozen) weights, so the traced graph gets plain ops, which it fuses on its own."""
    return torch.compiler.is_compiling()


def _onednn_ok(x: torch.Tensor, w: torch.Tensor) -> bool:
    return (_ONEDNN is not None and x.device.type == "cpu" and x.dtype == w.dtype
            and x.dtype in _ONEDNN_DTYPES and x.shape[-1] > 0
            and not _tracing())


def wgrad(g2: torch.Tensor, x2: torch.Tensor) -> torch.Tensor:
    """``g2.T @ x2`` for a weight gradient: (P, C) and (P, D) -> (C, D), P in the 10^5s.

    The BLAS runs this reduction over a huge inner dimension at 40-70% of its usual rate on
    this CPU (a transposed operand and one output tile shared by all threads). Cutting P into
    one slice per thread and summing the slices' products (a batched GEMM) measured 1.2-1.4x
    faster in float32 for the binary stream's shapes.
    """
    rows = g2.shape[0]
    k = torch.get_num_threads()
    if g2.device.type != "cpu" or k < 2 or rows < 8192 or rows % k or \
            g2.dtype != torch.float32:
        return g2.t().mm(x2)
    # (k, C, P/k) @ (k, P/k, D) -> (k, C, D) -> (C, D)
    return torch.bmm(g2.view(k, rows // k, -1).transpose(1, 2),
                     x2.view(k, rows // k, -1)).sum(0)


def _mm_linear(x2: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    if _onednn_ok(x2, w):
        return _ONEDNN(x2, w, b, "none", [], "")
    return F.linear(x2, w, b)


class _Linear(torch.autograd.Function):
    """``x @ w.T + b`` with the two products that read the big activation (the forward and
    the input gradient) on oneDNN, which measured 1.2-2x faster than the default BLAS on the
    binary stream's tall-and-thin shapes (B*T*T rows, tens of columns) on this CPU."""

    @staticmethod
    def forward(ctx, x, w, b):
        ctx.save_for_backward(x, w)
        ctx.has_bias = b is not None
        x2 = x.reshape(-1, x.shape[-1])
        return _mm_linear(x2, w, b).view(*x.shape[:-1], w.shape[0])

    @staticmethod
    def backward(ctx, grad):
        x, w = ctx.saved_tensors
        g2 = grad.reshape(-1, grad.shape[-1])
        grad_x = grad_w = grad_b = None
        if ctx.needs_input_grad[0]:
            grad_x = _mm_linear(g2, w.t().contiguous(), None).view_as(x)
        if ctx.needs_input_grad[1]:
            grad_w = wgrad(g2, x.reshape(-1, x.shape[-1]))
        if ctx.has_bias and ctx.needs_input_grad[2]:
            grad_b = g2.sum(0)
        return grad_x, grad_w, grad_b


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None):
    """``F.linear`` for the binary stream's big activations: oneDNN on CPU for float32 and
    bfloat16 (autocast included), plain ``F.linear`` everywhere else."""
    if torch.is_autocast_enabled("cpu") and x.device.type == "cpu":
        dtype = torch.get_autocast_dtype("cpu")
        x, weight = x.to(dtype), weight.to(dtype)
        bias = bias.to(dtype) if bias is not None else None
        with torch.autocast("cpu", enabled=False):
            return linear(x, weight, bias)
    if not _onednn_ok(x, weight) or not x.is_contiguous():
        return F.linear(x, weight, bias)
    return _Linear.apply(x, weight, bias)


# -- one projection, many consumers ------------------------------------------------------------


class _SegmentedLinear(torch.autograd.Function):
    """The projection of the binary stream ``x`` (B, T, T, D) onto several row-segments of one
    weight, each returned as its own tensor in the layout its consumer wants:

    * ``"cl"``: channels last (B, T, T, C), on oneDNN;
    * ``"cf"``: channels first (B, C, T, T), a batched GEMM -- softmaxes then run over a
      contiguous axis and the T x T products need no transposed copies.

    Unlike a fused projection followed by ``split`` (whose backward concatenates the segment
    gradients into one B x T x T x N tensor) or slicing (whose backward zero-fills one such
    tensor per slice), the backward accumulates each segment's contribution straight into the
    input gradient.
    """

    @staticmethod
    def forward(ctx, x, weight, bias, segments):
        B, T = x.shape[0], x.shape[1]
        D = x.shape[-1]
        x2 = x.reshape(-1, D)  # (B*T*T, D)
        outs = []
        for start, width, layout in segments:
            w = weight[start : start + width]
            b = None if bias is None else bias[start : start + width]
            if layout == "cl":
                outs.append(_mm_linear(x2, w, b).view(B, T, T, width))
            else:  # (C, D) @ (B, D, T*T) -> (B, C, T*T)
                xt = x.reshape(B, T * T, D).transpose(1, 2)
                if b is None:
                    out = torch.matmul(w, xt)
                else:
                    out = torch.baddbmm(b[None, :, None].expand(B, width, T * T),
                                        w.expand(B, width, D), xt)
                outs.append(out.view(B, width, T, T))
        ctx.save_for_backward(x, weight)
        ctx.segments = segments
        ctx.has_bias = bias is not None
        return tuple(outs)

    @staticmethod
    def backward(ctx, *grads):
        x, weight = ctx.saved_tensors
        B, T, D = x.shape[0], x.shape[1], x.shape[-1]
        x2 = x.reshape(-1, D)
        grad_x = None  # (B*T*T, D)
        grad_w = torch.zeros_like(weight)
        grad_b = weight.new_zeros(weight.shape[0]) if ctx.has_bias else None
        for (start, width, layout), g in zip(ctx.segments, grads, strict=True):
            if g is None:
                continue
            w = weight[start : start + width]
            if layout == "cl":
                g2 = g.reshape(-1, width)  # (P, C)
                if grad_x is None:
                    grad_x = _mm_linear(g2, w.t().contiguous(), None)
                else:
                    grad_x.addmm_(g2, w)
                grad_w[start : start + width] = wgrad(g2, x2)
                if grad_b is not None:
                    grad_b[start : start + width] = g2.sum(0)
            else:
                g3 = g.reshape(B, width, T * T)  # (B, C, T*T)
                gx = grad_x.view(B, T * T, D) if grad_x is not None else None
                if gx is None:
                    grad_x = torch.matmul(g3.transpose(1, 2), w).reshape(-1, D)
                else:
                    gx.baddbmm_(g3.transpose(1, 2), w.expand(B, width, D))
                grad_w[start : start + width] = torch.matmul(
                    g3, x.reshape(B, T * T, D)).sum(0)
                if grad_b is not None:
                    grad_b[start : start + width] = g3.sum(2).sum(0)  # 6x faster in bf16
        if grad_x is not None:
            grad_x = grad_x.view_as(x)
        return grad_x, grad_w, grad_b, None


def segmented_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                     segments: tuple[tuple[int, int, str], ...]) -> tuple[torch.Tensor, ...]:
    """Project ``x`` (B, T, T, D) onto the ``(start, width, "cl"|"cf")`` row segments of
    ``weight``; see `_SegmentedLinear`. Falls back to plain ops off the CPU fast path."""
    if torch.is_autocast_enabled("cpu") and x.device.type == "cpu":
        dtype = torch.get_autocast_dtype("cpu")
        with torch.autocast("cpu", enabled=False):
            return segmented_linear(x.to(dtype), weight.to(dtype),
                                    None if bias is None else bias.to(dtype), segments)
    if x.device.type != "cpu" or not x.is_contiguous() or _tracing():
        outs = []
        for start, width, layout in segments:
            b = None if bias is None else bias[start : start + width]
            y = F.linear(x, weight[start : start + width], b)  # (B, T, T, C)
            outs.append(y if layout == "cl" else y.permute(0, 3, 1, 2))
        return tuple(outs)
    return _SegmentedLinear.apply(x, weight, bias, segments)


# -- the binary Boolean stage --------------------------------------------------------------------


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
        h = _mm_linear(both.view(-1, both.shape[-1]), w_in, b_in)  # (P, F2)
        out = _mm_linear(F.gelu(h), w_out, b_out)  # (P, D2)
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
        grad_h = torch.ops.aten.gelu_backward(_mm_linear(g, w_out.t().contiguous(), None), h)
        grad_w_in = wgrad(grad_h, both)
        grad_b_in = grad_h.sum(0)
        grad_both = _mm_linear(grad_h, w_in.t().contiguous(), None)  # (P, 2 D2)
        grad_w_skip = wgrad(g, nt.view(-1, d2))
        grad_nt = grad_both[:, d2:].addmm(g, w_skip).view_as(n)  # d/d n(y, x)
        grad_n = grad_both[:, :d2].view_as(n) + grad_nt.transpose(1, 2)
        return grad_n, grad_w_in, grad_b_in, grad_w_out, grad_b, grad_w_skip, grad_b


def binary_ffn(n, w_in, b_in, w_out, b_out, w_skip, b_skip) -> torch.Tensor:
    """The binary FFN with recomputation on the CPU fast path; plain ops elsewhere."""
    if torch.is_autocast_enabled("cpu") and n.device.type == "cpu":
        dtype = torch.get_autocast_dtype("cpu")
        with torch.autocast("cpu", enabled=False):
            return binary_ffn(*(t.to(dtype) for t in (n, w_in, b_in, w_out, b_out, w_skip,
                                                      b_skip)))
    if not _onednn_ok(n, w_in) or not n.is_contiguous():
        nt = n.transpose(1, 2)
        hidden = F.gelu(F.linear(torch.cat([n, nt], dim=-1), w_in, b_in))
        return F.linear(hidden, w_out, b_out) + F.linear(nt, w_skip, b_skip)
    return _BinaryFFN.apply(n, w_in, b_in, w_out, b_out, w_skip, b_skip)
