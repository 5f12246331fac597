"""Operators contracted together with their projections (DESIGN.md section 6).

An operator's kernel and premise are linear projections of the normalised streams, and its
output goes through a linear projection back onto a stream. For the encoder's einsum path each
operator becomes one multi-operand ``torch.einsum`` (whose order opt_einsum picks) over:

* the kernel: materialised (always when it has a softmax, or when it comes from the cheap unary
  stream) or *folded*: the normalised binary stream and the projection weight as two operands;
* the premise: likewise;
and the result comes out laid out tokens first, channels last, ready for the layer's one
fused output projection.

Folding is chosen per tensor at build time when opt_einsum's cost for the folded expression is
below that of materialising (projection GEMM + contraction). E.g. ``p`` then never builds its
B x T x T x S premise: it applies ``sum_w K_hw(x) W_wd`` to the binary stream per token. A folded
tensor's projection bias enters as extra, smaller einsum terms (the product of sums expanded),
broadcast over the token indices they lack.

Letters: b batch; x y a tokens; h s w channels (spec letters); d f the input channels of a
folded kernel / premise.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import opt_einsum

from folnet.ops.spec import TOKEN_LETTERS, OperatorSpec

FOLD_LETTER = {"kernel": "d", "premise": "f"}


@dataclass(frozen=True)
class Term:
    """One einsum of the expanded product: which tensors enter as projection or as bias."""

    equation: str
    roles: tuple[tuple[str, str], ...]  # (role, "tensor" | "fold" | "bias") per kernel/premise
    out_letters: str  # letters of this term's result, a subsequence of the full output
    missing_factor: int  # product of sizes of reduced token letters no operand carries
    permute: tuple[int, ...] | None  # einsum's output order -> out_letters (None: the same)


@dataclass(frozen=True)
class FusedPlan:
    """How one operator is contracted: which tensors are folded, and the einsum terms."""

    fold: tuple[tuple[str, bool], ...]  # (role, folded?)
    terms: tuple[Term, ...]

    def folded(self, role: str) -> bool:
        return dict(self.fold)[role]


def _operands(spec: OperatorSpec, role: str, mode: str) -> list[str]:
    idx = spec.tensor(role)
    if mode == "tensor":
        return ["b" + "".join(idx)]
    tokens = "".join(c for c in idx if c in TOKEN_LETTERS)
    channels = "".join(c for c in idx if c not in TOKEN_LETTERS)
    letter = FOLD_LETTER[role]
    if mode == "fold":
        return ["b" + tokens + letter, channels + letter]
    return [channels]  # bias: indexed by the tensor's channels only


def _term(spec: OperatorSpec, modes: dict[str, str], sizes: dict[str, int]) -> Term:
    subs = _operands(spec, "kernel", modes["kernel"]) + _operands(spec, "premise",
                                                                   modes["premise"])
    present = set("".join(subs))
    out_letters = "".join(c for c in output_letters(spec) if c in present)
    factor = 1
    if spec.rdim in TOKEN_LETTERS and spec.rdim not in present:
        factor = sizes[spec.rdim]
    order = _einsum_order(subs, out_letters)
    permute = None if order == out_letters else tuple(order.index(c) for c in out_letters)
    return Term(equation=",".join(subs) + "->" + order, roles=tuple(modes.items()),
                out_letters=out_letters, missing_factor=factor, permute=permute)


def _einsum_order(subs: list[str], out_letters: str) -> str:
    """The output order handed to ``torch.einsum`` for a two-operand term: letters both
    operands carry, then the kernel's own, then the premise's. torch makes the operand owning
    the first free output letter the left factor of its batched product; with the kernel on
    the left, a channels-first premise read as (summed token, free token) -- ``c``'s -- is the
    right factor in its own memory order, so its gradient comes back in that order too instead
    of transposed (which cost a B x S x T x T copy per layer). `run_terms` permutes the result
    back to ``out_letters`` (a view)."""
    if len(subs) != 2:
        return out_letters
    left, right = set(subs[0]), set(subs[1])
    both = [c for c in out_letters if c in left and c in right]
    return "".join(both + [c for c in out_letters if c not in right] +
                   [c for c in out_letters if c not in left])


def output_letters(spec: OperatorSpec) -> str:
    """The fused path's output layout: batch, the output's tokens, then its channels."""
    return "b" + "".join(c for c in spec.output if c in TOKEN_LETTERS) + "".join(
        c for c in spec.output if c not in TOKEN_LETTERS)


def _shapes(term: Term, sizes: dict[str, int]) -> list[tuple[int, ...]]:
    return [tuple(sizes[c] for c in sub) for sub in term.equation.split("->")[0].split(",")]


def plan_operator(spec: OperatorSpec, channel_sizes: dict[str, int], *, d_in: dict[str, int],
                  biases: dict[str, bool], batch: int = 8, seq_len: int = 128) -> FusedPlan:
    """Decide what to fold and build the einsum terms for one operator (non-causal path)."""
    sizes = {"b": batch, "x": seq_len, "y": seq_len, "a": seq_len,
             "d": d_in["kernel"], "f": d_in["premise"], **channel_sizes}
    fold = {}
    for role in ("kernel", "premise"):
        foldable = spec.stream(role) == "B" and not (
            role == "kernel" and spec.activation == "softmax")
        if not foldable:
            fold[role] = False
            continue
        other = {r: ("fold" if fold.get(r) else "tensor") for r in ("kernel", "premise")}
        as_tensor = _term(spec, {**other, role: "tensor"}, sizes)
        as_fold = _term(spec, {**other, role: "fold"}, sizes)
        idx = spec.tensor(role)
        width = math.prod(sizes[c] for c in idx if c not in TOKEN_LETTERS)
        tokens = math.prod(sizes[c] for c in idx if c in TOKEN_LETTERS)
        materialise = 2 * batch * tokens * sizes[FOLD_LETTER[role]] * width
        cost_tensor = materialise + _cost(as_tensor, sizes)
        fold[role] = _cost(as_fold, sizes) < cost_tensor
    options = {r: (["fold", "bias"] if biases[r] else ["fold"]) if fold[r] else ["tensor"]
               for r in ("kernel", "premise")}
    terms = tuple(_term(spec, {"kernel": k, "premise": p}, sizes)
                  for k, p in itertools.product(options["kernel"], options["premise"]))
    return FusedPlan(fold=tuple(fold.items()), terms=terms)


def _cost(term: Term, sizes: dict[str, int]) -> int:
    shapes = _shapes(term, sizes)
    _path, info = opt_einsum.contract_path(term.equation, *shapes, shapes=True,
                                           optimize="optimal")
    return int(info.opt_cost)


def run_terms(plan: FusedPlan, operands: dict[str, list], bias: dict[str, object],
              full_shape: tuple[int, ...], full_letters: str):
    """Evaluate and sum the einsum terms of one operator.

    ``operands[role]`` is ``[tensor]`` or ``[stream, weight]``; ``bias[role]`` the folded
    tensor's projection bias (channels only). The result is laid out as ``full_letters``.
    """
    import torch

    total = None
    for term in plan.terms:
        args = []
        for role, mode in term.roles:
            args += operands[role] if mode != "bias" else [bias[role]]
        out = torch.einsum(term.equation, *args)
        if term.permute is not None:
            out = out.permute(term.permute)  # a view
        if term.missing_factor != 1:
            out = out * term.missing_factor
        if term.out_letters != full_letters:  # broadcast over the token indices it lacks
            shape = [full_shape[i] if c in term.out_letters else 1
                     for i, c in enumerate(full_letters)]
            out = out.reshape(shape)
            if total is None:
                out = out.expand(full_shape)
        total = out if total is None else total + out
    return total
