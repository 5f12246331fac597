"""The token domain a layer's operators range over, and the masks that come with it.

An encoder's layer sees a full bidirectional square: every token of the sequence relates to
every other. A causal layer adds a visibility matrix keep[row, col] (plain causal order, a
PrefixLM's pattern, or an encoder-decoder's "inputs then targets"). And a layer may compute
only some *query rows* of a longer domain: the encoder-decoder's target rows after the
encoder's input rows, or the one new row of cached generation. `Domain` carries all of it, so
that one layer serves every kind of model.

Shapes: B batch, n tokens of the domain, Q query rows (Q = n for a full square).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from folnet.ops import masks

#: ``hook(own_u, own_b) -> buffers``: a causal layer hands over the *context channels* of its
#: query rows (the projections indexed by positions other than the query: (B, Q, Wu) and
#: (B, Q, n, Wb), see `folnet.arch.layer`); the hook stores them (a generation cache) and
#: returns the context buffers over the whole domain ((B, n, Wu), (B, n, n, Wb)) that the
#: operators read instead, or None to read the rows' own projections (a full square).
ContextHook = Callable[[torch.Tensor | None, torch.Tensor | None],
                       tuple[torch.Tensor | None, torch.Tensor | None] | None]


@dataclass(frozen=True, eq=False)
class Domain:
    """What a layer needs to know about its tokens besides their atoms."""

    n: int  # tokens of the domain
    pad: torch.Tensor | None = None  # (B, n) True = real token; None: nothing masked
    visible: torch.Tensor | None = None  # (B|1, n, n) causal keep[row, col]; None: bidirectional
    rows: torch.Tensor | None = None  # (Q,) domain positions of the query rows; None: all
    rel_ids: torch.Tensor | None = None  # (B|1, n, n) relative-distance ids, for rpe*

    @property
    def causal(self) -> bool:
        return self.visible is not None

    def visible_rows(self) -> torch.Tensor | None:
        """keep[row, col] of the query rows: (B|1, Q, n), or None when bidirectional."""
        if self.visible is None or self.rows is None:
            return self.visible
        return self.visible.index_select(1, self.rows)

    def keep(self) -> torch.Tensor | None:
        """The rows' binary pairs a causal layer keeps: (B|1, Q, n, 1), or None."""
        vis = self.visible_rows()
        return None if vis is None else vis.unsqueeze(-1)

    def order(self, query: str) -> masks.Visibility | None:
        """The visibility as an operator whose query letter is ``query`` sees it."""
        if self.visible is None:
            return None
        return masks.Visibility(self.visible, query, self.rows)

    def transposed(self, n2: torch.Tensor) -> torch.Tensor | None:
        """The binary FFN's transposed input u2(y, x) for the rows' normalised atoms ``n2``
        (B, Q, n, D2): None for a bidirectional square (the FFN transposes n2 itself). A causal
        square passes ``n2`` transposed, zero wherever y does not see x since u2 is masked and
        LN(0) = 0. Query rows must come after every other row of the domain and be unseen by
        them (encoder rows, already generated rows), so u2(y, x) is nonzero only for query rows
        y, taken from the rows' own block."""
        if self.visible is None:
            return None
        if self.rows is None:
            return n2.transpose(1, 2)  # (B, T, T, D2)
        rows = self.rows
        block = n2.index_select(2, rows).transpose(1, 2)  # (B, Q, Q, D2) u2(y, x), y, x rows
        seen = self.visible_rows().index_select(2, rows).transpose(1, 2)  # (B|1, Q, Q)
        block = block * seen.unsqueeze(-1)
        return torch.zeros_like(n2).index_copy(2, rows, block)  # (B, Q, n, D2)


def visibility(n: int, device: torch.device, prefix: torch.Tensor | None = None,
               source: int = 0, positions: torch.Tensor | None = None) -> torch.Tensor:
    """keep[row, col] of a causal domain of n positions, (B|1, n, n): causal; plus a
    bidirectional block over each row's prefix (PrefixLM, ``prefix`` (B,) counted in
    ``positions`` (B|1, n) from the row's first real token) or over the first ``source``
    positions (the encoder-decoder's input tokens)."""
    if prefix is None and source == 0:
        return masks.tril(n, device).unsqueeze(0)
    if prefix is None:
        prefix = torch.tensor([source], device=device)
    return masks.prefix_visibility(prefix, n, positions)
