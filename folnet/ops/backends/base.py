"""What every backend shares: the call description it decides on, the operand it receives,
and the kernel activation (masks, softmax over the R-dim, attention dropout).

A backend declares what it supports and answers *why not* for a given call (the xformers
dispatch habit): ``why_not(spec, call)`` returns None when the backend can run the call, else a
reason; ``why_not_spec(spec, causal)`` says why it can never run an operator, whatever the
tensors, so a forced backend fails when the operator is compiled. ``layout(op, role)`` says how
the backend wants a projected kernel or premise handed over (channels last, channels first,
or folded: the stream and the projection weight, never materialised), and ``run`` contracts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from folnet.ops import masks
from folnet.ops.primitives import dropout
from folnet.ops.spec import TOKEN_LETTERS, OperatorSpec

LAYOUTS = ("cl", "cf", "fold")  # channels last, channels first, folded into the contraction


@dataclass(frozen=True)
class OpCall:
    """What a backend needs to know to decide whether it can run an operator call."""

    device: torch.device
    dtype: torch.dtype
    causal: bool
    padded: bool
    requires_grad: bool
    rows: bool = False  # only some query rows of a longer token domain
    materialise: bool = False  # the caller wants kernel and premise materialised (rpe*)


@dataclass(frozen=True, eq=False)
class Operand:
    """A kernel or premise as a backend receives it: ``tensor`` laid out as ``letters`` (batch
    first, implicit). Folded (``weight`` set): ``tensor`` is the normalised stream
    (B, *tokens, D) -- ``letters`` its tokens and one input-channel letter -- and the operand is
    ``tensor @ weight`` (+ ``bias``) with ``weight`` (*channels, D), ``bias`` (*channels).
    ``sink`` (a materialised operand read whole by each block of rows): a tensor of its shape
    and layout to which a backend may add the operand's gradient in place
    (`folnet.ops.primitives.sink`) instead of returning it -- or ignore, leaving it to autograd."""

    tensor: torch.Tensor
    letters: tuple[str, ...]
    weight: torch.Tensor | None = None
    bias: torch.Tensor | None = None
    sink: torch.Tensor | None = None

    @property
    def folded(self) -> bool:
        return self.weight is not None

    def laid_out(self, idx: tuple[str, ...]) -> torch.Tensor:
        """The materialised tensor permuted (a view) into the index order ``idx``."""
        return self._permuted(self.tensor, idx)

    def sink_laid_out(self, idx: tuple[str, ...]) -> torch.Tensor | None:
        """The sink permuted like `laid_out` (None without one)."""
        return None if self.sink is None else self._permuted(self.sink, idx)

    def _permuted(self, t: torch.Tensor, idx: tuple[str, ...]) -> torch.Tensor:
        if self.letters == idx:
            return t
        return t.permute([0] + [1 + self.letters.index(c) for c in idx])

    def sizes(self) -> dict[str, int]:
        """The size of every letter it carries (the channels of a folded one included)."""
        if not self.folded:
            return dict(zip(self.letters, self.tensor.shape[1:], strict=True))
        toks = [c for c in self.letters if c in TOKEN_LETTERS]
        return dict(zip(toks, self.tensor.shape[1:-1], strict=True))


class CompiledOperator(Protocol):
    """What a backend reads of the compiled operator it runs (`folnet.ops.compiler`)."""

    spec: OperatorSpec
    dims: tuple[tuple[str, int], ...] | None  # the model dimensions, when compiled with them


class Backend:
    """A way of contracting an operator's kernel and premise."""

    name = "?"

    def why_not(self, spec: OperatorSpec, call: OpCall) -> str | None:
        raise NotImplementedError

    def why_not_spec(self, spec: OperatorSpec, causal: bool) -> str | None:
        return None

    def prepare(self, spec: OperatorSpec, causal: bool,
                dims: tuple[tuple[str, int], ...] | None) -> object | None:
        """What this backend decides once, when an operator is compiled (`CompiledOperator`
        keeps it as ``op.prepared[name]``), so that no call prepares again: a traced call
        (torch.compile, torch.export) could not -- the planning parses size expressions and
        searches contraction orders, each a graph break. None: nothing to prepare."""
        return None

    def layout(self, op: CompiledOperator, role: str) -> str:
        """How a projected ``role`` tensor is handed to `run`: one of `LAYOUTS`."""
        return "cl"

    def run(self, op: CompiledOperator, kernel: Operand, premise: Operand,
            pad: torch.Tensor | None, *, order: masks.Visibility | None, dropout_p: float,
            premasked: frozenset[str] = frozenset()) -> torch.Tensor:
        """The operator's output laid out as ``op.spec.output`` (batch first)."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"<backend {self.name!r}>"


def activate(spec: OperatorSpec, kernel: torch.Tensor, kidx: tuple[str, ...], *,
             order: masks.Visibility | None, pad: torch.Tensor | None, dropout_p: float,
             premasked: bool = False) -> torch.Tensor:
    """Masks, the kernel activation over the R-dim and attention dropout, on a kernel laid out
    as ``kidx`` (any order: the softmax runs over wherever the R-dim sits)."""
    keep = masks.kernel_keep(spec, kidx, order=order, pad=pad, premasked=premasked)
    if spec.activation == "softmax":
        if keep is not None:
            kernel = kernel.masked_fill(~keep, masks.fill_value(kernel.dtype))
        kernel = torch.softmax(kernel, dim=1 + kidx.index(spec.rdim))
    elif keep is not None:
        kernel = kernel * keep
    return dropout(kernel, dropout_p, True) if dropout_p > 0.0 else kernel


def activated_kernel(spec: OperatorSpec, kernel: Operand, pad: torch.Tensor | None, *,
                     order: masks.Visibility | None, dropout_p: float = 0.0,
                     premasked: bool = False) -> tuple[torch.Tensor, tuple[str, ...]]:
    """The kernel, materialised, masked and activated (`activate`), and its index letters: the
    spec's, with the query letter prepended when a causal kernel lacks it (its normalisation
    then differs per query token, so it is broadcast over them)."""
    K = kernel.laid_out(spec.kernel)
    kidx = masks.expanded_kernel(spec, order is not None)
    if kidx != spec.kernel:  # (B, *k) -> (B, q, *k)
        ntok = K.shape[1 + spec.kernel.index(spec.rdim)]
        K = K.unsqueeze(1).expand(K.shape[0], query_rows(order, ntok), *K.shape[1:])
    return activate(spec, K, kidx, order=order, pad=pad, dropout_p=dropout_p,
                    premasked=premasked), kidx


def query_rows(order: masks.Visibility, ntok: int) -> int:
    """How many query positions a call has: its rows, or the whole domain."""
    return ntok if order.rows is None else order.rows.shape[0]  # (symbolic while traced)

