"""The blocked runner: the layer's stages over blocks of query rows, each block recomputed in
the backward pass (`folnet.ops.primitives.recompute`) -- the CPU's long-sequence memory modes
(`folnet.arch.layer.memory_modes` decides when; the layer's `forward` picks this runner or the
stages as their equations, `folnet.arch.layer.mixer.mix` and `DualStreamLayer.binary_ffn_stage`,
which know nothing of it). `mix_blocks` runs the mixer, `ffn_blocks` the binary FFN; both give
the whole square's outputs (tests/arch/test_blocked_models.py).

A block of rows r0:r1 reads what the operator specs say it needs (`block_reach`, fixed per
layer): a tensor whose first token is the operator's query letter is projected from the
block's row slab (of n1 or n2), a binary one whose last token is (``c``'s premise,
bidirectionally) from its column slab, every other one (``t``'s premise, unary premises) once
for all rows -- by the recomputed function's prologue, span by span, or, when a causal layer
hands them to a context hook (its context channels), before it. Every reduction runs along a
row's columns, so each block's softmax is exact: blocks give the whole square's outputs.

In blocks (`folnet.ops.primitives.recompute`) a block's projections, kernels and premises (N2
channels per pair) are alive for that block only; the binary update's residual dropout is
applied inside the blocks, so that the gradient they receive is the residual's own, not a
second full-size tensor, and (without a context hand-off) the blocks normalise their own slabs
of u2, so that what the recomputed function saves is u2 -- the layer's input, kept anyway --
not a normalised copy of the square.

Key to shapes: B batch, Q query rows, R a block's rows, n tokens of the domain, D1/D2 stream
widths, M1 concatenated unary outputs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from folnet.arch.layer.dispatch import Key, Mixer, Parts, Premasked
from folnet.arch.layer.domain import Domain
from folnet.arch.layer.mixer import LayerCall, Residual, writes
from folnet.libc import release_free_memory
from folnet.ops import Operand
from folnet.ops.primitives.recompute import Block, Prologue, Slab, recompute_blocks

__all__ = ["ffn_blocks", "mix_blocks"]


@dataclass(frozen=True)
class Shared:
    """The operands every block reads whole, by key, with their index letters; how they reach
    the blocks: made span by span by ``prologue`` (then ``given`` is empty), or made before
    and passed in as inputs of those names (a causal layer's context channels, which its hook
    must see); and which of them are premasked. It holds no tensor: the blocks' function
    keeps it until its backward pass, and under activation checkpointing that is also the
    first forward's function -- a tensor held here would outlive the checkpoint's free."""

    letters: dict[Key, tuple[str, ...]]
    given: tuple[Key, ...]
    prologue: Prologue | None
    premasked: Premasked

    def operands(self, block: Block) -> Parts:
        """The shared operands as one block receives them (with their gradient sinks in the
        backward pass, when the prologue made them)."""
        given = block.made if self.prologue is not None else {k: block.inputs[k]
                                                              for k in self.given}
        sinks = block.sinks or {}
        return {k: Operand(t, self.letters[k], sink=sinks.get(k)) for k, t in given.items()}


def _shared(layer: Mixer, n1: torch.Tensor, n2: torch.Tensor | None, call: LayerCall,
            common: list[Key], norm: Callable[[torch.Tensor], torch.Tensor]
            ) -> tuple[Shared, dict[Key, torch.Tensor]]:
    """How the blocks get the operands ``common`` they read whole, and the tensors handed in
    for them. Without a context hook a prologue makes them span by span inside the recomputed
    function (nothing handed in); a causal layer's hook must see them (its context channels),
    so they are made here and handed in."""
    dispatch = call.dispatch
    if call.context is None:
        letters = {k: layer.letters(k, dispatch.layouts[k]) for k in common}
        # each made tensor's row axis: after the channels of a channels-first one
        dims = {k: 1 + (len(layer.segments[k].channels)
                        if dispatch.layouts[k] == "cf" else 0) for k in common}

        def rows_of(block: Block) -> dict[Key, torch.Tensor]:  # rows r0:r1 of each
            parts = layer.project(block.slabs["n1 rows"], norm(block.slabs["n2 rows"]),
                                  dispatch, common)
            return {k: parts[k].tensor for k in common}

        return Shared(letters, (), Prologue(rows_of, dims) if common else None, {}), {}
    parts = layer.project(n1, n2, dispatch, common)
    taken, premasked = layer.take_context(parts, call.visible, call.context)
    parts.update(taken)
    return (Shared({k: op.letters for k, op in parts.items()}, tuple(parts), None, premasked),
            {k: op.tensor for k, op in parts.items()})


def _contiguous(t: torch.Tensor) -> torch.Tensor:
    """A slab of the normalised stream as the projections read it (one copy, one block's)."""
    return t.contiguous()


def mix_blocks(layer: Mixer, call: LayerCall, u1: torch.Tensor, u2: torch.Tensor
               ) -> tuple[torch.Tensor, torch.Tensor, None]:
    """`folnet.arch.layer.mixer.mix` in ``call.spans``, each block of rows recomputed in the
    backward pass (`folnet.ops.primitives.recompute`); the same outputs. Without a context hand-off
    the blocks normalise their own slabs of u2, so that no normalised square is made or kept,
    and add the binary residual themselves (a hook needs n2 whole: it is made here). The third
    output, `mix`'s fused norm, is never made here (None)."""
    dispatch, domain = call.dispatch, call.domain
    n1 = layer.norm_unary(u1)
    n2 = None if call.context is None else layer.norm_binary(u2)
    streams = writes(layer, call)
    drop_u = Residual.draw(u1, call.p, "U" in streams)
    # (B, Q, n, D2), drawn over the spans: their backward draws their rows of it again rather
    # than keeping it
    drop_b = Residual.draw(u2, call.p, "B" in streams, call.spans)
    # what the blocks read of the binary stream, and how they normalise what they read
    binary, norm = (u2, layer.norm_binary) if n2 is None else (n2, _contiguous)
    reach = layer.reach(dispatch.wanted)
    folded = [k for k in reach["all"] if dispatch.layouts[k] == "fold"]  # read whole n2
    shared, handed = _shared(layer, n1, n2, call, [k for k in reach["all"] if k not in folded],
                             norm)
    rate = drop_b.p  # what the blocks read of the residual's dropout: its mask comes as a slab
    # (Q,) the rows' domain positions, sliced per block
    at = domain.rows if domain.rows is not None else torch.arange(u2.shape[1],
                                                                   device=u2.device)

    def block(b: Block) -> dict[str, torch.Tensor]:
        parts = shared.operands(b)
        if folded:  # (B, Q, n, D2) whole, normalised again per block when u2 is handed
            whole = norm(b.inputs["n2"])
            parts.update({k: layer.folded(k, whole) for k in folded})
        # one contiguous (normalised) copy of each slab, one block's worth: (B, R, D1),
        # (B, R, n, D2), (B, n, R, D2)
        parts.update(layer.project(b.slabs["n1 rows"], norm(b.slabs["n2 rows"]), dispatch,
                                   reach["row"]))
        if reach["col"]:
            parts.update(layer.project(None, norm(b.slabs["n2 cols"]), dispatch, reach["col"]))
        rel = None if domain.rel_ids is None else domain.rel_ids.narrow(1, b.r0, b.r1 - b.r0)
        sub = Domain(n=domain.n, pad=domain.pad, visible=domain.visible, rows=at[b.r0 : b.r1],
                     rel_ids=rel)
        mixed_u, update = layer.updates(layer.operate(parts, dispatch, sub, shared.premasked),
                                        sub)
        if update is not None:  # (B, R, n, D2)
            update = Residual.inside(update, b.slabs.get("drop"), rate)
        return {name: t for name, t in (("unary", mixed_u), ("binary", update))
                if t is not None}

    # "n2": n2, or u2 when the blocks normalise it (then the recomputed function saves only
    # u2, which the layer keeps anyway, not a normalised copy of the square)
    inputs: dict = {"n1": n1, "n2": binary, **handed}
    # n1's and n2's row slabs, n2's column slab on a full square (whose columns are its rows;
    # query rows of a longer domain are causal, whose operators' causal form reads no column
    # slab: that slab then goes unread)
    slabs = {"n1 rows": Slab("n1", 1), "n2 rows": Slab("n2", 1),
             "n2 cols": Slab("n2", 2 if domain.rows is None else 1)}
    # blocks handed u2 read it itself: its residual is added inside the recomputed function, whose
    # backward then sums u2's gradient into the update's incoming one (one square, not two)
    inside = {"binary": "n2"} if n2 is None and "B" in streams else {}
    if drop_b.mask is not None:
        inputs["drop"], slabs["drop"] = drop_b.mask, Slab("drop", 1)
    redrawn = {} if drop_b.rows is None else {"drop": drop_b.rows}
    outs = recompute_blocks(block, call.spans, inputs, list(layer.parameters()), slabs,
                            shared.prologue, inside, redrawn,
                            release=release_free_memory if call.release_heap else None)
    if "unary" in outs:  # (B, Q, M1)
        u1 = drop_u.add(u1, layer.out_u(outs["unary"]))
    if "binary" in outs:  # (B, Q, n, D2)
        u2 = outs["binary"] if inside else drop_b.add(u2, outs["binary"], applied=True)
        if call.visible is not None:
            u2 = u2 * call.visible
    return u1, u2, None


def ffn_blocks(layer: Mixer, call: LayerCall, u2: torch.Tensor) -> torch.Tensor:
    """The layer's binary FFN stage, ``u2 + drop(ffn_b(LN u2))``, over a full square
    (bidirectional or causal: u2 is masked, so its transpose is n2's) in blocks of
    ``call.ffn_rows`` rows, each recomputed in the backward pass (`BinaryFFN.blocks`): the
    residual dropout applied inside them (the mask drawn first, as for the whole, and drawn
    again per block by the backward pass) and the LayerNorm to each block's slabs, so that no
    normalised square is made or kept."""
    rows, count = call.ffn_rows, u2.shape[1]
    drop_b = Residual.draw(u2, call.p, spans=[(r0, min(count, r0 + rows))
                                              for r0 in range(0, count, rows)])
    update = layer.ffn_b.blocks(u2, rows, keep=drop_b.mask, p=drop_b.p,
                                eps=layer.cfg.layer_norm_eps, redrawn=drop_b.rows)
    u2 = drop_b.add(u2, update, applied=True)
    return u2 if call.visible is None else u2 * call.visible
