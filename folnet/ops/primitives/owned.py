"""Whether autograd alone holds a gradient, so that a backward pass may write into it.

Why: a recomputed function whose output is its input plus an update (a residual,
`folnet.ops.primitives.recompute`) can sum the input's gradient into the output's incoming
gradient itself instead of into a second full-size tensor -- but only if nothing else reads
that tensor afterwards. Autograd hands one gradient to several nodes where an op's backward
returns it unchanged for two inputs (an add), so the answer is read from torch's own reference
counts, as PyTorch's input buffer reads them before it adds in place. Those counts are private
API: a torch without them gets False (a copy, never a wrong sum).

What "alone" reads differs between torch versions inside a custom Function's backward: torch
2.13 hands the backward the engine's only reference to its incoming gradient, while torch 2.11
keeps one more for the length of the call (the list it passes in), dropped when the call
returns. `incoming_alone` therefore compares against the counts a probe's backward reads, once,
for a gradient nothing else holds; a second holder (another node's input buffer, a node's
post-hook) adds to them on every version (tests/ops/test_recompute_blocks.py).
"""

from __future__ import annotations

import functools

import torch

from folnet.ops.primitives.functorch import transformed

__all__ = ["incoming_alone"]


def _counts(t: torch.Tensor) -> tuple[int, int] | None:
    """(uses of t, uses of its storage) by torch's own counts; None where this torch lacks
    them or t is a view (its base holds it too)."""
    use = getattr(t, "_use_count", None)
    storage_use = getattr(torch._C, "_storage_Use_Count", None)
    if use is None or storage_use is None or t._base is not None:
        return None
    return use(), storage_use(t.untyped_storage()._cdata)


def incoming_alone(grad: torch.Tensor) -> bool:
    """Whether autograd alone holds ``grad``, an incoming gradient as a custom Function's
    backward receives it (see the module docstring): its counts are those a probe's backward
    reads for a gradient nothing else holds. Never under a torch.func transform, where the
    gradient is a wrapper whose counts are not autograd's."""
    if transformed():
        return False
    got, alone = _counts(grad), _incoming_alone_counts()
    return got is not None and got == alone


class _Probe(torch.autograd.Function):
    """An identity whose backward records the counts of the gradient it receives."""

    @staticmethod
    def forward(x: torch.Tensor, seen: list) -> torch.Tensor:
        return x.clone()

    @staticmethod
    def setup_context(ctx, inputs: tuple, output: torch.Tensor) -> None:
        ctx.seen = inputs[1]

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        ctx.seen.append(_counts(grad))
        return grad, None


@functools.cache
def _incoming_alone_counts() -> tuple[int, int] | None:
    """The counts of an incoming gradient nothing else holds, inside a custom Function's
    backward on this torch: the probe's output times 2, so that its gradient is the product's
    own fresh tensor (not a view of the loss's)."""
    seen: list = []
    with torch.enable_grad():
        x = torch.ones(4, requires_grad=True)
        torch.autograd.grad((_Probe.apply(x, seen) * 2.0).sum(), x)
    return seen[0]
