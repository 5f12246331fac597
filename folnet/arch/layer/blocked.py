"""The layer's mixer ``rows`` query rows at a time, for inputs whose binary stream would not fit
in memory whole (`folnet.arch.layer.memory` decides when).

Each block is recomputed in the backward pass (`folnet.ops.kernels.recompute`), so that its
projections, kernels and premises (N2 channels per pair) are alive for one block only. What a
block reads is read from the operator specs (`block_reach`): a tensor whose first token is the
operator's query letter is projected from the block's row slab (of n1 or n2), a binary one
whose last token is (``c``'s premise, bidirectionally) from its column slab, every other one
(``t``'s premise, unary premises) once for all rows -- by the recomputed function's prologue,
span by span, or, when a causal layer hands them to a context hook (its context channels),
before it. Every reduction runs along a row's columns, so each block's softmax is exact: the
outputs equal the whole mixer's. The blocks also apply the binary update's residual dropout
(masks drawn first, in the whole layer's order), so the gradient they receive is the
residual's own, not a second full-size tensor.

Key to shapes: B batch, Q query rows, R a block's rows, n tokens of the domain, D1/D2 stream
widths, M1 concatenated unary outputs.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from folnet.arch.layer.dispatch import Dispatch, Key, Mixer, Parts, Premasked
from folnet.arch.layer.domain import ContextHook, Domain
from folnet.arch.layer.memory import block_reach
from folnet.ops import Operand
from folnet.ops.kernels import dropout_add, keep_mask
from folnet.ops.kernels.dropout import add_update, masked_scale
from folnet.ops.kernels.recompute import Block, Prologue, Slab, recompute_blocks

__all__ = ["mix_blocked"]


@dataclass(frozen=True)
class Shared:
    """The operands every block reads whole, by key, with their index letters; how they reach
    the blocks: made span by span by ``prologue`` (then ``inputs`` is empty), or made before
    and passed in as ``inputs`` (a causal layer's context channels, which its hook must see);
    and which of them are premasked."""

    letters: dict[Key, tuple[str, ...]]
    inputs: dict[Key, torch.Tensor]
    prologue: Prologue | None
    premasked: Premasked

    def operands(self, block: Block) -> Parts:
        """The shared operands as one block receives them (with their gradient sinks in the
        backward pass, when the prologue made them)."""
        given = block.made if self.prologue is not None else {k: block.inputs[k]
                                                              for k in self.inputs}
        sinks = block.sinks or {}
        return {k: Operand(t, self.letters[k], sink=sinks.get(k)) for k, t in given.items()}


def shared_operands(layer: Mixer, n1: torch.Tensor, n2: torch.Tensor, dispatch: Dispatch,
                    common: list[Key], context: ContextHook | None,
                    keep: torch.Tensor | None) -> Shared:
    """How the blocks get the operands ``common`` they read whole. Without a context hook a
    prologue makes them span by span inside the recomputed function; a causal layer's hook
    must see them (its context channels), so they are made here and handed in."""
    if context is None:
        letters = {k: layer.letters(k, dispatch.layouts[k]) for k in common}
        # each made tensor's row axis: after the channels of a channels-first one
        dims = {k: 1 + (len(layer.slots[k[0]].segment(k[1]).channels)
                        if dispatch.layouts[k] == "cf" else 0) for k in common}

        def rows_of(block: Block) -> dict[Key, torch.Tensor]:  # rows r0:r1 of each
            parts = layer.project(block.slabs["n1 rows"], block.slabs["n2 rows"].contiguous(),
                                  dispatch, common)
            return {k: parts[k].tensor for k in common}

        return Shared(letters, {}, Prologue(rows_of, dims) if common else None, {})
    parts = layer.project(n1, n2, dispatch, common)
    taken, premasked = layer.take_context(parts, keep, context)
    parts.update(taken)
    return Shared({k: op.letters for k, op in parts.items()},
                  {k: op.tensor for k, op in parts.items()}, None, premasked)


def mix_blocked(layer: Mixer, u1: torch.Tensor, u2: torch.Tensor, n1: torch.Tensor,
                n2: torch.Tensor, domain: Domain, dispatch: Dispatch,
                context: ContextHook | None, keep: torch.Tensor | None, rows: int
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """The mixer over u1 (B, Q, D1), u2 (B, Q, n, D2) (n1, n2 their normalised forms) in
    blocks of ``rows`` query rows; returns both updated, the residual added."""
    reach = block_reach({i: layer.ops[i].spec for i in dispatch.wanted})
    folded = [k for k in reach["all"] if dispatch.layouts[k] == "fold"]  # read the full n2
    shared = shared_operands(layer, n1, n2, dispatch,
                             [k for k in reach["all"] if k not in folded], context, keep)
    count = n2.shape[1]
    at = (domain.rows if domain.rows is not None
          else torch.arange(count, device=n2.device))  # (Q,) domain positions
    writes = {layer.slots[i].spec.typing.output for i in dispatch.wanted}
    p = layer.cfg.dropout if layer.training else 0.0
    drop_u = keep_mask(u1.shape, p, u1.device) if p and "U" in writes else None
    drop_b = keep_mask(u2.shape, p, u2.device) if p and "B" in writes else None  # (B, Q, n, D2)
    inputs: dict = {"n1": n1, "n2": n2, **shared.inputs}
    # n1's and n2's row slabs, n2's column slab on a full square (whose columns are its rows;
    # query rows of a longer domain are causal, whose operators' causal form reads no column
    # slab: that slab then goes unread)
    slabs = {"n1 rows": Slab("n1", 1), "n2 rows": Slab("n2", 1),
             "n2 cols": Slab("n2", 2 if domain.rows is None else 1)}
    if drop_b is not None:
        inputs["drop"], slabs["drop"] = drop_b, Slab("drop", 1)

    def block(b: Block) -> dict[str, torch.Tensor]:
        parts = shared.operands(b)
        parts.update({k: layer.folded(k, b.inputs["n2"]) for k in folded})
        # one contiguous copy of each slab, one block's worth: (B, R, D1), (B, R, n, D2),
        # (B, n, R, D2)
        parts.update(layer.project(b.slabs["n1 rows"], b.slabs["n2 rows"].contiguous(),
                                   dispatch, reach["row"]))
        if reach["col"]:
            parts.update(layer.project(None, b.slabs["n2 cols"].contiguous(), dispatch,
                                       reach["col"]))
        rel = None if domain.rel_ids is None else domain.rel_ids.narrow(1, b.r0, b.r1 - b.r0)
        sub = Domain(n=domain.n, pad=domain.pad, visible=domain.visible, rows=at[b.r0 : b.r1],
                     rel_ids=rel)
        mixed_u, update = layer.updates(layer.operate(parts, dispatch, sub, shared.premasked),
                                        sub)
        if update is not None and drop_b is not None:  # (B, R, n, D2)
            update = masked_scale(update, b.slabs["drop"], 1.0 / (1.0 - p))
        return {name: t for name, t in (("unary", mixed_u), ("binary", update))
                if t is not None}

    spans = [(r0, min(count, r0 + rows)) for r0 in range(0, count, rows)]
    outs = recompute_blocks(block, spans, inputs, list(layer.parameters()), slabs,
                            shared.prologue)
    if "unary" in outs:  # (B, Q, M1)
        u1 = dropout_add(u1, layer.out_u(outs["unary"]), p, layer.training, drop_u)
    if "binary" in outs:  # (B, Q, n, D2), dropped out already
        u2 = add_update(u2, outs["binary"])
        if keep is not None:
            u2 = u2 * keep
    return u1, u2
