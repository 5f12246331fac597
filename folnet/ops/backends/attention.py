"""Backends for operators with *attention shape*: torch SDPA and xformers.

A softmax-kernel operator has attention shape when its kernel is ``(query letters, groups,
a)``, its premise ``(a, groups, value letters)`` and its output ``(query, groups, value)``; the
kernel then becomes the additive attention bias and the queries and keys are zero, so attention
computes exactly ``softmax_a(K) . v`` (docs/design.md section 6).
"""

from __future__ import annotations

import importlib
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from folnet.ops import masks
from folnet.ops.backends.base import Backend
from folnet.ops.spec import OperatorSpec

_ZERO_DIM = 8  # head dim of the all-zero queries/keys; 8 suits every fused kernel's alignment


@dataclass(frozen=True)
class AttentionLayout:
    """How an operator maps onto attention: letter groups of the query, group and value axes."""

    queries: tuple[str, ...]
    groups: tuple[str, ...]
    values: tuple[str, ...]


def attention_layout(spec: OperatorSpec) -> AttentionLayout | None:
    """The attention mapping of a softmax-kernel operator, or None if it has no attention shape."""
    if spec.activation != "softmax":
        return None
    k, p, _o = set(spec.kernel), set(spec.premise), set(spec.output)
    groups = tuple(c for c in spec.output if c in k and c in p)
    queries = tuple(c for c in spec.output if c in k and c not in p)
    values = tuple(c for c in spec.output if c in p and c not in k)
    if not queries or k != set(queries) | set(groups) | {spec.rdim}:
        return None
    if p != set(values) | set(groups) | {spec.rdim}:
        return None
    return AttentionLayout(queries, groups, values)


def _to_attention(spec, layout, kernel, premise, pad, order, premasked):
    """Mask, then permute kernel/premise into (B, G, Q, A) bias and (B, G, A, V) values."""
    kernel = kernel.laid_out(spec.kernel)
    premise = premise.laid_out(spec.premise)
    keep = masks.kernel_keep(spec, spec.kernel, order=order, pad=pad,
                             premasked="kernel" in premasked)
    pkeep = masks.premise_keep(spec, spec.premise, order=order,
                               premasked="premise" in premasked)
    if keep is not None:
        kernel = kernel.masked_fill(~keep, masks.fill_value(kernel.dtype))
    if pkeep is not None:
        premise = premise * pkeep
    kperm = [0] + [1 + spec.kernel.index(c) for c in (*layout.groups, *layout.queries, spec.rdim)]
    pperm = [0] + [1 + spec.premise.index(c) for c in (*layout.groups, spec.rdim, *layout.values)]
    bias = kernel.permute(kperm)
    value = premise.permute(pperm)
    ng, nq = len(layout.groups), len(layout.queries)
    batch = kernel.shape[0]
    gshape, qshape = bias.shape[1 : 1 + ng], bias.shape[1 + ng : 1 + ng + nq]
    vshape = value.shape[2 + ng :]
    g, q, a = math.prod(gshape), math.prod(qshape), bias.shape[-1]
    bias = bias.reshape(batch, g, q, a)  # (B, G, Q, A)
    value = value.reshape(batch, g, a, math.prod(vshape))  # (B, G, A, V)
    return bias, value, (gshape, qshape, vshape)


def _from_attention(spec, layout, out, shapes):
    """(B, G, Q, V) attention output back to the spec's output layout."""
    gshape, qshape, vshape = shapes
    out = out.reshape(out.shape[0], *gshape, *qshape, *vshape)
    order = (*layout.groups, *layout.queries, *layout.values)
    return out.permute([0] + [1 + order.index(c) for c in spec.output])


class SdpaBackend(Backend):
    """torch.nn.functional.scaled_dot_product_attention with the kernel as a float bias."""

    name = "sdpa"

    def why_not_spec(self, spec, causal):
        if attention_layout(spec) is None:
            return "the operator has no attention shape (softmax over a token, kernel (q, g, a), "\
                   "premise (a, g, v))"
        if causal and masks.expanded_kernel(spec, True) != spec.kernel:
            return "causal normalisation needs the kernel per query token"
        return None

    def why_not(self, spec, call):
        reason = self.why_not_spec(spec, call.causal)
        if reason is not None:
            return reason
        if call.dtype not in (torch.float32, torch.float16, torch.bfloat16, torch.float64):
            return f"dtype {call.dtype} is not a floating type SDPA accepts"
        return None

    def run(self, op, kernel, premise, pad, *, order, dropout_p, premasked=frozenset()):
        spec = op.spec
        layout = attention_layout(spec)
        bias, value, shapes = _to_attention(spec, layout, kernel, premise, pad, order,
                                            premasked)
        b, g, q, a = bias.shape
        zq = bias.new_zeros(b, g, q, _ZERO_DIM)
        zk = bias.new_zeros(b, g, a, _ZERO_DIM)
        out = F.scaled_dot_product_attention(zq, zk, value, attn_mask=bias, dropout_p=dropout_p)
        return _from_attention(spec, layout, out, shapes)


_UNRESOLVED = object()
_xformers: object = _UNRESOLVED  # xformers.ops, None when it cannot be imported


def _xformers_ops():
    """xformers.ops, or None; looked up once and kept in a module variable. Why not an
    lru_cache: dynamo traces through one, and a first look-up inside a traced call imports a
    module there (a graph break per call, seen on an H200); `XformersBackend.plan` looks it up
    when an operator is compiled, so a traced call only reads the variable."""
    global _xformers
    if _xformers is _UNRESOLVED:
        try:
            _xformers = importlib.import_module("xformers.ops")
        except Exception:  # ImportError, or a broken build raising at import time
            _xformers = None
    return _xformers


class XformersBackend(Backend):
    """xformers.ops.memory_efficient_attention (CUDA only) with the kernel as a tensor bias."""

    name = "xformers"

    def why_not(self, spec, call):
        if _xformers_ops() is None:
            return "xformers is not installed (pip install 'folnet[gpu]')"
        if call.device.type != "cuda":
            return f"xformers runs on CUDA tensors only, got {call.device.type}"
        if call.dtype not in (torch.float32, torch.float16, torch.bfloat16):
            return f"dtype {call.dtype} is not supported by memory_efficient_attention"
        return SdpaBackend().why_not(spec, call)

    def why_not_spec(self, spec, causal):
        return SdpaBackend().why_not_spec(spec, causal)

    def prepare(self, spec, causal, dims):
        _xformers_ops()  # resolved now, while nothing is traced
        return None

    def run(self, op, kernel, premise, pad, *, order, dropout_p, premasked=frozenset()):
        spec = op.spec
        xops = _xformers_ops()
        layout = attention_layout(spec)
        bias, value, shapes = _to_attention(spec, layout, kernel, premise, pad, order,
                                            premasked)
        b, g, q, a = bias.shape
        # A tensor bias needs every stride but the last aligned: pad the last dim, then slice.
        bias = _aligned(bias, 8)
        zq = value.new_zeros(b, q, g, _ZERO_DIM)
        zk = value.new_zeros(b, a, g, _ZERO_DIM)
        out = xops.memory_efficient_attention(zq, zk, value.transpose(1, 2), attn_bias=bias,
                                              p=dropout_p)  # (B, Q, G, V)
        return _from_attention(spec, layout, out.transpose(1, 2), shapes)


def _aligned(bias: torch.Tensor, align: int) -> torch.Tensor:
    """A differentiable copy of ``bias`` whose last dimension is padded to a multiple of
    ``align`` and sliced back, so that its strides satisfy xformers' tensor-bias rule."""
    a = bias.shape[-1]
    return F.pad(bias, (0, -(-a // align) * align - a))[..., :a]
