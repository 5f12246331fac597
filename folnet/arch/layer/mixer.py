"""The layer's mixer stage as its equation over the whole square: for each stream s that its
operators write, ``u_s + drop(W_s [op(K, v) for each operator])``, every kernel K and premise v
a projection of the normalised streams LN(u1), LN(u2). Plain autograd ops throughout: what
every short input, a GPU and torch.compile run (one graph). The same stage over recomputed
blocks of query rows -- the CPU's long-sequence memory modes -- is `folnet.arch.layer.row_blocks`'s
runner, which this stage does not know about; both give the same outputs
(tests/arch/test_blocked_models.py). What a call decides before it computes anything is one
`LayerCall`, and each residual update's dropout one `Residual`: the values the stages and the
runner are handed, by name.

Key to shapes: B batch, Q query rows, n tokens of the domain, D1/D2 stream widths, M1
concatenated unary outputs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from folnet.arch.layer.dispatch import Dispatch, Mixer, Parts, Premasked
from folnet.arch.layer.domain import ContextHook, Domain
from folnet.ops.primitives import dropout_add, keep_mask
from folnet.ops.primitives.dropout import RowMask, add_update, masked_scale, native
from folnet.ops.primitives.residual_norm import residual_norm

__all__ = ["LayerCall", "Residual", "mix", "project_all", "writes"]


@dataclass(frozen=True)
class Residual:
    """One residual update's dropout in a call: its keep mask (None: no dropout) and rate.
    Drawn by `draw` before the stage runs, in the whole layer's order, so that blocks and the
    whole square drop the same elements under one seed; applied by `add` to the update made
    whole (one pass), or by `inside` to each recomputed block's piece (then `add` only adds)."""

    mask: torch.Tensor | None
    p: float = 0.0
    rows: RowMask | None = None  # the mask's generator states, when drawn over row spans

    @classmethod
    def draw(cls, like: torch.Tensor, p: float, wanted: bool = True,
             spans: Sequence[tuple[int, int]] | None = None) -> Residual:
        """``spans``: the blocks of rows (dim 1) that will read the mask, recomputed: drawn
        piece by piece (`RowMask`: the same bits), so that they can draw their rows again."""
        if not wanted or p == 0.0:
            return cls(None)
        if spans is None:  # torch's own dropout on CUDA: drawn as the update is added
            return cls(None if native(like.device) else keep_mask(like.shape, p, like.device), p)
        mask, rows = RowMask.draw(like.shape, p, like.device, spans)
        return cls(mask, p, rows)

    @staticmethod
    def inside(piece: torch.Tensor, mask_rows: torch.Tensor | None, p: float) -> torch.Tensor:
        """A recomputed block's piece of the update, dropped out at rate ``p`` with its rows of
        the mask (a static method: the blocks' function must not hold the whole mask)."""
        if mask_rows is None:
            return piece
        return masked_scale(piece, mask_rows, 1.0 / (1.0 - p))

    def add(self, residual: torch.Tensor, update: torch.Tensor, *, applied: bool = False
            ) -> torch.Tensor:
        """``residual + dropout(update)``; ``applied``: the update was dropped out inside."""
        if applied:  # a fresh tensor the blocks wrote: added into in place
            return add_update(residual, update)
        return dropout_add(residual, update, self.p, self.p > 0.0, self.mask)


@dataclass(frozen=True)
class LayerCall:
    """What one layer call decides before it computes anything, by name."""

    domain: Domain
    dispatch: Dispatch  # which operators run, on which routes
    visible: torch.Tensor | None  # (B|1, Q, n, 1) the pairs a causal layer keeps, or None
    spans: tuple[tuple[int, int], ...]  # the mixer's blocks of query rows
    ffn_rows: int | None  # the binary FFN's rows per block (None: the whole square)
    context: ContextHook | None  # a causal layer's context hand-off
    attentions: dict[str, torch.Tensor] | None  # filled with the softmax kernels, on request
    p: float  # the residual dropout rate (0 in eval)
    recompute: bool  # the blocks recomputed in the backward pass (the memory mode's choice)
    release_heap: bool = False  # they return the heap's free pages ("tight", on a CPU)
    # the mixer's binary residual and the binary FFN's LayerNorm as one fused op
    # (`folnet.ops.primitives.residual_norm`: its why_not said None)
    fuse_norm: bool = False


def writes(layer: Mixer, call: LayerCall) -> set[str]:
    """The streams the call's operators write ("U", "B")."""
    return {layer.slots[i].spec.typing.output for i in call.dispatch.wanted}


def project_all(layer: Mixer, n1: torch.Tensor, n2: torch.Tensor, call: LayerCall
                ) -> tuple[Parts, Premasked]:
    """Every operand of the call projected in one pass over each normalised stream, and the
    context hand-off made from them (a causal layer's, when the call has a hook)."""
    parts = layer.project(n1, n2, call.dispatch, call.dispatch.keys())
    if call.context is None:
        return parts, {}
    taken, premasked = layer.take_context(parts, call.visible, call.context)
    parts.update(taken)
    return parts, premasked


def mix(layer: Mixer, call: LayerCall, u1: torch.Tensor, u2: torch.Tensor
        ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """u1 (B, Q, D1), u2 (B, Q, n, D2) -> both after the mixer's residual updates, and LN of
    the new u2 when the call fuses the binary residual with that norm (``call.fuse_norm``:
    the binary FFN reads it), else None."""
    streams = writes(layer, call)
    drop_u = Residual.draw(u1, call.p, "U" in streams)
    fused = call.fuse_norm and "B" in streams
    drop_b = Residual.draw(u2, call.p, "B" in streams and not fused)
    parts, premasked = project_all(layer, layer.norm_unary(u1), layer.norm_binary(u2), call)
    outs = layer.operate(parts, call.dispatch, call.domain, premasked, call.attentions)
    mixed_u, update = layer.updates(outs, call.domain)  # (B, Q, M1), (B, Q, n, D2)
    if mixed_u is not None:
        u1 = drop_u.add(u1, layer.out_u(mixed_u))
    if update is not None and fused:  # u2 + drop(update) and its LN in one pass
        return (u1, *residual_norm(u2, update, call.p, layer.cfg.layer_norm_eps))
    if update is not None:
        u2 = drop_b.add(u2, update)
        if call.visible is not None:  # a causal layer keeps its binary atoms triangular
            u2 = u2 * call.visible
    return u1, u2, None
