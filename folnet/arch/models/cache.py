"""The incremental generation cache of a causal FOLNet.

A new token at domain position t computes one new row of every stream at every layer: its
unary state u1[t] and its binary row u2[t, :t+1] (both carried from layer to layer, never
stored). What it also needs from the past rows are their *context channels*, the per-layer
projections indexed by positions other than the query (see `folnet.arch.layer.dual_stream`):

* unary, ``(B, capacity, Wu)``: the premise rows of ``j`` and ``a`` and the kernel rows of
  ``c`` of every position so far;
* binary: the premise rows v(a, :) of ``t`` (the only built-in operator that reads binary rows
  other than the query's), multiplied by the visibility and stored channel-first,
  ``(B, Wb, capacity, capacity)``: each channel's (n, n) block then has unit stride along a
  row, and ``t``'s batched matrix product reads it in place (with the channels last it would
  gather every block through a stride-Wb copy, much slower: docs/results/measurements.md).

For an encoder-decoder the first N rows hold the projected encoder atoms. Both buffers are
allocated once for the whole generation and filled row by row, so a step costs one row's work
(O(n) per operator, O(n^2) for ``t``'s contraction) instead of a full recomputation (O(n^2)
projections, O(n^3) for ``t``). The cache also holds the domain's static facts, sized for the
full capacity: visibility, padding, the atoms' positions and the relative-position ids.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from folnet.arch.layer import DualStreamLayer
from folnet.arch.layer.domain import ContextHook, Domain
from folnet.errors import FolnetError
from folnet.tracing import traced


def _sized(t: torch.Tensor | None, *dims: int) -> torch.Tensor | None:
    """``t`` with its capacity dimensions ``dims`` marked dynamic for torch.compile: a step
    compiled before the cache grows then serves after it (a mark, no copy; eager ignores it).
    A trace cannot mark (a buffer made by a traced step has symbolic sizes already)."""
    if t is not None and not traced():
        torch._dynamo.maybe_mark_dynamic(t, dims)
    return t


class GenerationCache:
    """Context buffers of every layer plus the domain's masks, for ``capacity`` positions."""

    def __init__(self, layers: Sequence[DualStreamLayer], *, batch: int, capacity: int,
                 visible: torch.Tensor, pad: torch.Tensor | None, positions: torch.Tensor,
                 rel_ids: torch.Tensor | None, dtype: torch.dtype, device: torch.device,
                 static: bool = False):
        self.batch = batch
        self.length = 0  # positions whose context channels are stored
        # static: the capacity is final and a step reads all of it (`step_static`); its
        # buffers keep their addresses (CUDA graphs replay in-place writes into them)
        self.static = static
        self.facts(visible, pad, positions, rel_ids)
        self.ctx_u: list[torch.Tensor | None] = []
        self.ctx_b: list[torch.Tensor | None] = []
        for layer in layers:
            self.ctx_u.append(self._kept(torch.zeros(batch, capacity, layer.width_u,
                                                     dtype=dtype, device=device), 1)
                              if layer.width_u else None)
            self.ctx_b.append(self._kept(torch.zeros(batch, layer.width_b, capacity, capacity,
                                                     dtype=dtype, device=device), 2, 3)
                              if layer.width_b else None)

    def _kept(self, t: torch.Tensor, *dims: int) -> torch.Tensor:
        """A buffer: its capacity dimensions marked dynamic (`_sized`), or, in a static
        cache, its address marked static for torch.compile (a CUDA graph then writes into the
        buffer itself rather than a copy of it)."""
        if not self.static:
            return _sized(t, *dims)
        if not traced():
            torch._dynamo.mark_static_address(t)
        return t

    @property
    def capacity(self) -> int:
        """Positions the buffers hold: read from them, so that under torch.compile it is the
        buffers' symbolic size, not a number a compiled step would be specialised on."""
        return self.visible.shape[-1]

    def facts(self, visible: torch.Tensor, pad: torch.Tensor | None, positions: torch.Tensor,
              rel_ids: torch.Tensor | None) -> None:
        """Set the domain's static facts, sized for the capacity."""
        mark = (lambda t, *dims: t) if self.static else _sized
        self.visible = mark(visible, 1, 2)  # (B|1, capacity, capacity) bool
        self.pad = mark(pad, 1)  # (B, capacity) bool, or None
        self.positions = mark(positions, 1)  # (B|1, capacity) the atoms' position of each row
        self.rel_ids = mark(rel_ids, 1, 2)  # (B|1, capacity, capacity) long, or None (no RPE)

    def grow(self, capacity: int, visible: torch.Tensor, pad: torch.Tensor | None,
             positions: torch.Tensor, rel_ids: torch.Tensor | None) -> None:
        """Make room for ``capacity`` positions (a generation whose length is not known up
        front, as transformers' generate runs it): new buffers holding the old ones, and the
        domain facts for the new capacity. A static cache does not grow."""
        if self.static:
            raise FolnetError(f"a static generation cache holds {self.capacity} positions and "
                              f"cannot grow to {capacity}: size it for the whole generation "
                              f"(prompt + max_new_tokens)")
        old = self.capacity
        for i, t in enumerate(self.ctx_u):
            if t is not None:  # (B, cap, Wu)
                self.ctx_u[i] = _sized(t.new_zeros(t.shape[0], capacity, t.shape[2]), 1)
                self.ctx_u[i][:, :old] = t
        for i, t in enumerate(self.ctx_b):
            if t is not None:  # (B, Wb, cap, cap)
                self.ctx_b[i] = _sized(t.new_zeros(*t.shape[:2], capacity, capacity), 2, 3)
                self.ctx_b[i][:, :, :old, :old] = t
        self.facts(visible, pad, positions, rel_ids)

    def reorder(self, index: torch.Tensor) -> None:
        """Keep the rows ``index`` (B',) of the batch, in that order (beam search): every
        buffer and every per-row fact."""
        batch = self.batch

        def pick(t):
            return t if t is None or t.shape[0] != batch else t.index_select(0, index)

        self.batch = int(index.numel())
        self.ctx_u = [pick(t) for t in self.ctx_u]
        self.ctx_b = [pick(t) for t in self.ctx_b]
        self.facts(pick(self.visible), pick(self.pad), pick(self.positions), pick(self.rel_ids))

    def write(self, layer: int, start: int | torch.Tensor, ctx_u: torch.Tensor | None,
              ctx_b: torch.Tensor | None) -> None:
        """Store the context channels of rows ``start:start + Q`` (their binary columns
        ``:start + Q``, already masked): ctx_u (B, Q, Wu), ctx_b (B, Q, start + Q, Wb). A
        static step's ``start`` is the rows' positions (Q,) as a tensor, and its binary rows
        span every column (B, Q, capacity, Wb): written by index, in place."""
        if isinstance(start, torch.Tensor):
            if ctx_u is not None:
                self.ctx_u[layer].index_copy_(1, start, ctx_u)
            if ctx_b is not None:
                self.ctx_b[layer].index_copy_(2, start, ctx_b.permute(0, 3, 1, 2))
            return
        if ctx_u is not None:
            self.ctx_u[layer][:, start : start + ctx_u.shape[1]] = ctx_u
        if ctx_b is not None:
            stop = start + ctx_b.shape[1]
            self.ctx_b[layer][:, :, start:stop, : ctx_b.shape[2]] = ctx_b.permute(0, 3, 1, 2)

    def view(self, layer: int, n: int) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """The context buffers of the first ``n`` positions: (B, n, Wu), (B, n, n, Wb) (views;
        the binary one channel-first in memory)."""
        cu, cb = self.ctx_u[layer], self.ctx_b[layer]
        return ((None if cu is None else cu[:, :n]),
                (None if cb is None else cb[:, :, :n, :n].permute(0, 2, 3, 1)))

    def hook(self, layer: int, start: int | torch.Tensor, *, read: bool) -> ContextHook:
        """For the layer's context channels of rows ``start:start + Q``: store them; with
        ``read``, return the buffers of every position up to and including them (query rows
        read the past from the cache), else None (a full square reads its own)."""

        def context(own_u, own_b):
            self.write(layer, start, own_u, own_b)
            if not read:
                return None
            if isinstance(start, torch.Tensor):  # a static step reads every position
                return self.view(layer, self.capacity)
            own = own_u if own_u is not None else own_b
            return self.view(layer, start + (0 if own is None else own.shape[1]))

        return context

    def domain(self, n: int, start: int | None = None) -> Domain:
        """The domain of the first ``n`` positions; with ``start``, its query rows start..n-1."""
        rows = None if start is None else torch.arange(start, n, device=self.visible.device)
        return Domain(n=n, pad=None if self.pad is None else self.pad[:, :n],
                      visible=self.visible[:, :n, :n], rows=rows)

    def atoms_at(self, start: int, n: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Positions (B|1, Q) and relative ids (B|1, Q, n) of the rows ``start:n``."""
        rel = None if self.rel_ids is None else self.rel_ids[:, start:n, :n]
        return self.positions[:, start:n], rel

    def static_step(self, rows: torch.Tensor
                    ) -> tuple[Domain, torch.Tensor, torch.Tensor | None]:
        """A static step's domain -- every position of the capacity, query ``rows`` (Q,) --
        and the rows' positions (B|1, Q) and relative ids (B|1, Q, capacity): every shape is
        the capacity's, whatever the rows (one graph, one CUDA graph for the whole
        generation). Columns not yet written hold zeros and are not visible to the rows."""
        domain = Domain(n=self.capacity, pad=self.pad, visible=self.visible, rows=rows)
        rel = None if self.rel_ids is None else self.rel_ids.index_select(1, rows)
        return domain, self.positions.index_select(1, rows), rel
