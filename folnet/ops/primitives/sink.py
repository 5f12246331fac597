"""A two-operand einsum whose operands' gradients may be *added in place* to given tensors
(their sinks) instead of being returned through autograd.

Why: a block of query rows reads some tensors whole (``t``'s premise v(a, y): every row reduces
over all of a). Recomputed block by block in the backward pass (`recompute_blocks`), each
block's gradient of such a tensor is a full-size tensor -- for ``t`` a B x D2 x T x T product
per block -- allocated, added to the running total and freed, block after block: one more
full-size tensor alive, and on glibc a fresh mapping of that size (page faults) per block.
With a sink the product is accumulated where the total lives (one ``baddbmm_`` when the sink's
memory order allows it, else one einsum and an ``add_``).
"""

from __future__ import annotations

import torch
from einops import rearrange

from folnet.errors import FolnetError
from folnet.ops.primitives.autocast import cast_once
from folnet.ops.primitives.functorch import transformed

__all__ = ["sink_einsum"]


def _sizes(p: torch.Tensor, groups: tuple[str, ...]) -> list[int]:
    """One size per letter group of ``p`` (whose dimensions are the groups' letters in order)."""
    sizes, at = [], 0
    for g in groups:
        sizes.append(int(torch.Size(p.shape[at : at + len(g)]).numel()))
        at += len(g)
    return sizes


def _grouped(t: torch.Tensor, letters: str, groups: tuple[str, ...], *, copy: bool
             ) -> torch.Tensor | None:
    """``t`` (laid out as ``letters``) permuted to the letter groups, one dimension per group:
    a view, or None when its memory does not allow one (``copy``: then a copy)."""
    if copy:  # "b x a y -> (b) (x y) (a)": a view where the memory allows, else a copy
        return rearrange(t, f"{' '.join(letters)} -> "
                         + " ".join(f"({' '.join(g)})" for g in groups))
    p = t.permute([letters.index(c) for c in "".join(groups)])
    return p.view(_sizes(p, groups)) if p.is_contiguous() else None


def _accumulate(sink: torch.Tensor, want: str, a: torch.Tensor, a_letters: str,
                g: torch.Tensor, g_letters: str) -> None:
    """``sink += einsum(f"{a_letters},{g_letters}->{want}", a, g)``, as one batched product
    written into ``sink``'s memory where its layout allows (the operands are block-sized and
    may be copied; the sink is not)."""
    batch = "".join(c for c in want if c in a_letters and c in g_letters)
    m = "".join(c for c in want if c in a_letters and c not in g_letters)
    n = "".join(c for c in want if c in g_letters and c not in a_letters)
    k = "".join(c for c in a_letters if c in g_letters and c not in want)
    if (len(batch + m + n) == len(want) and set(a_letters) == set(batch + m + k)
            and set(g_letters) == set(batch + n + k) and sink.dtype == a.dtype == g.dtype):
        # sink laid out (batch, m, n): a (batch, m, k) @ g (batch, k, n); or (batch, n, m)
        for (x, xl, first), (y, yl, second) in (((a, a_letters, m), (g, g_letters, n)),
                                                ((g, g_letters, n), (a, a_letters, m))):
            out = _grouped(sink, want, (batch, first, second), copy=False)
            if out is not None:
                out.baddbmm_(_grouped(x, xl, (batch, first, k), copy=True),
                             _grouped(y, yl, (batch, k, second), copy=True))
                return
    sink.add_(torch.einsum(f"{a_letters},{g_letters}->{want}", a, g))


class _SinkEinsum(torch.autograd.Function):
    """The einsum, keeping both operands; the backward adds into the sinks it was given. Its
    forward and backward are torch ops that vmap batches (torch.func generates the rule);
    `sink_einsum` hands it no sinks under a transform."""

    generate_vmap_rule = True

    @staticmethod
    def forward(equation: str, left: torch.Tensor, right: torch.Tensor,
                left_sink: torch.Tensor | None, right_sink: torch.Tensor | None) -> torch.Tensor:
        return torch.einsum(equation, left, right)

    @staticmethod
    def setup_context(ctx, inputs: tuple, output: torch.Tensor) -> None:
        ctx.equation, left, right, *sinks = inputs
        ctx.sinks = tuple(sinks)
        ctx.save_for_backward(left, right)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        left, right = ctx.saved_tensors
        inputs, out = ctx.equation.split("->")
        lhs, rhs = inputs.split(",")
        grads: list[torch.Tensor | None] = []
        # each operand's gradient: the other operand against the output's gradient
        for k, (other, other_letters, letters) in enumerate(((right, rhs, lhs),
                                                             (left, lhs, rhs))):
            sink = ctx.sinks[k]
            if not ctx.needs_input_grad[1 + k]:
                grads.append(None)
            elif sink is not None:
                _accumulate(sink, letters, other, other_letters, grad, out)
                grads.append(None)
            else:
                grads.append(torch.einsum(f"{other_letters},{out}->{letters}", other, grad))
        return None, grads[0], grads[1], None, None


def sink_einsum(equation: str, left: torch.Tensor, right: torch.Tensor,
                sinks: tuple[torch.Tensor | None, torch.Tensor | None] = (None, None)
                ) -> torch.Tensor:
    """``torch.einsum(equation, left, right)`` (explicit output, no repeated letter within an
    operand, no ellipsis) where the gradient of an operand with a sink -- a tensor of its shape,
    laid out as its letters -- is added to that sink in place and not returned. Under
    autocast both operands are cast once to its dtype and multiplied in it. An equation that
    sums a letter within one operand ignores the sinks (autograd returns the gradients), and
    so does a call under a torch.func transform (a sink is written in place, which a batched
    gradient cannot be into an unbatched sink; the recomputed blocks that pass sinks do not
    run there)."""
    if "->" not in equation or "." in equation or equation.count(",") != 1:
        raise FolnetError(f"sink_einsum needs an explicit two-operand equation like "
                          f"'bxa,bay->bxy', got equation={equation!r}")
    inputs, out = equation.split("->")
    lhs, rhs = inputs.split(",")
    alone = (set(lhs) ^ set(rhs)) - set(out)  # letters summed within one operand
    if all(s is None for s in sinks) or not torch.is_grad_enabled() or alone or transformed():
        return torch.einsum(equation, left, right)
    cast_out = cast_once(_sink_apply, left.device, (left, right), equation, sinks,
                         devices=("cpu", "cuda"))
    return cast_out if cast_out is not None else _sink_apply(left, right, equation, sinks)


def _sink_apply(left: torch.Tensor, right: torch.Tensor, equation: str,
                sinks: tuple[torch.Tensor | None, ...]) -> torch.Tensor:
    return _SinkEinsum.apply(equation, left, right, *sinks)
