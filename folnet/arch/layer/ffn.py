"""The Boolean FFN stage (the operator ``b``) on both streams."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from folnet.arch import adapters
from folnet.ops.primitives import binary_ffn
from folnet.ops.primitives.dropout import RowMask


class UnaryFFN(nn.Module):
    """``Linear(D1, F1) -> GELU -> Linear(F1, D1)`` on the unary stream."""

    def __init__(self, d1: int, f1: int):
        super().__init__()
        self.inp = nn.Linear(d1, f1)
        self.out = nn.Linear(f1, d1)

    def forward(self, n1: torch.Tensor) -> torch.Tensor:
        return self.out(F.gelu(self.inp(n1)))  # (B, Q, D1)


class BinaryFFN(nn.Module):
    """The binary Boolean stage: ``[u2(x,y), u2(y,x)] -> Linear -> GELU -> Linear`` plus a skip
    Linear of ``u2(y,x)``. The concatenation is explicit: on a CPU the copy costs less than
    computing the transposed half as a transposed GEMM output, whose strided adds run over
    B x T x T x F2 (docs/results/measurements.md)."""

    def __init__(self, d2: int, f2: int):
        super().__init__()
        self.inp = nn.Linear(2 * d2, f2)
        self.out = nn.Linear(f2, d2)
        self.skip = nn.Linear(d2, d2)

    def forward(self, n2: torch.Tensor, n2t: torch.Tensor | None = None) -> torch.Tensor:
        """n2 (B, Q, n, D2) -> (B, Q, n, D2). ``n2t`` is the transposed input u2(y, x); None
        for a full square, where it is ``n2`` transposed (`folnet.ops.primitives.binary_ffn`)."""
        return binary_ffn(n2, *self._params(), nt=n2t)

    def blocks(self, u2: torch.Tensor, rows: int, *, keep: torch.Tensor | None = None,
               p: float = 0.0, eps: float | None = None, redrawn: RowMask | None = None
               ) -> torch.Tensor:
        """`forward` over a full square ``rows`` query rows at a time, each block recomputed in
        the backward pass. ``keep`` (a bool mask of u2's shape) applies the residual dropout of
        rate ``p`` to the output; ``eps`` makes ``u2`` the stream before its LayerNorm, applied
        by each block to its own slabs (None: ``u2`` is already normalised); ``redrawn`` is
        ``keep``'s `RowMask` over those blocks, kept for the backward pass instead of
        ``keep``."""
        return binary_ffn(u2, *self._params(), rows=rows, keep=keep, p=p, eps=eps,
                          redrawn=redrawn)

    def _params(self) -> list[torch.Tensor]:
        return [t for m in (self.inp, self.out, self.skip)  # adapters included
                for t in (adapters.weight(m), adapters.bias(m))]
