"""A causal layer's context hand-off: the channels of its query rows indexed by a position other
than the query (``j``'s and ``a``'s unary premises, ``c``'s kernel, ``t``'s premise v(a, y)) go
to a `ContextHook` -- a generation cache, or an encoder-decoder's encoder context -- and the
operators read the buffers it gives back over the whole domain.

`context_offsets` lays the channels out once, when the layer is built; `take_context` runs the
hand-off in a call, for the mixer whole (`folnet.arch.layer.mixer`) or in blocks
(`folnet.arch.layer.row_blocks`).

Shapes: B batch, Q query rows, n tokens of the domain, Wu/Wb the context widths.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from folnet.arch.layer.dispatch import Key, Parts, Premasked
from folnet.arch.layer.domain import ContextHook
from folnet.arch.layer.slots import STREAMS, Segment, natural
from folnet.ops import Operand
from folnet.ops.backends.base import CompiledOperator
from folnet.ops.spec import ROLES

__all__ = ["context_offsets", "take_context"]


def context_offsets(ops: Sequence[CompiledOperator], queries: Sequence[str],
                    segments: Mapping[Key, Segment]) -> tuple[dict[Key, int], dict[str, int]]:
    """Where each context tensor sits in its stream's context buffer ({key: offset}), and each
    stream's context width: the operands whose first token is not their operator's query
    letter (``queries``), in slot order."""
    offsets: dict[Key, int] = {}
    width = {"U": 0, "B": 0}
    for i, op in enumerate(ops):
        for role in ROLES:
            if op.spec.tokens(role)[0] != queries[i]:
                seg = segments[i, role]
                offsets[i, role] = width[seg.stream]
                width[seg.stream] += seg.width
    return offsets, width


def take_context(offsets: Mapping[Key, int], segments: Mapping[Key, Segment],
                 ops: Sequence[CompiledOperator], parts: Parts, keep: torch.Tensor | None,
                 hook: ContextHook) -> tuple[Parts, Premasked]:
    """Hand the rows' context channels to ``hook``; returns the operands read from the buffers
    it gives back, and which of them are premasked. Operators this call skips (a
    ``unary_only`` layer's binary-output ones) have no projections in ``parts``: their channels
    go to the hook as zeros (the buffers keep one layout), or not at all when no operator of a
    stream reads context, and none is read back."""
    own = {}
    for stream in STREAMS:
        keys = [k for k in offsets if segments[k].stream == stream]
        present = [k for k in keys if k in parts]
        if present:  # (B, Q, [n,] W) in context order
            channels = {k: segments[k].channels for k in keys}
            first = parts[present[0]].tensor
            lead = first.shape[: first.ndim - len(channels[present[0]])]
            own[stream] = torch.cat([
                parts[k].tensor.flatten(-len(channels[k])) if k in parts
                else first.new_zeros(*lead, segments[k].width)
                for k in keys], -1)
    if "B" in own:
        own["B"] = own["B"] * keep  # (B, Q, n, Wb): the pairs the rows see
    buffers = hook(own.get("U"), own.get("B"))
    if buffers is None:
        return {}, {}
    taken: Parts = {}
    premasked: dict[int, frozenset[str]] = {}
    for (i, role), start in offsets.items():
        if (i, role) not in parts:
            continue
        seg, spec = segments[i, role], ops[i].spec
        buf = buffers[STREAMS.index(seg.stream)]  # (B, n, [n,] W)
        t = buf.narrow(-1, start, seg.width).unflatten(-1, seg.channels)
        taken[i, role] = Operand(t, natural(spec.tensor(role)))
        if seg.stream == "B" and (role == "premise" or spec.activation != "softmax"):
            premasked[i] = premasked.get(i, frozenset()) | {role}
    return taken, premasked
