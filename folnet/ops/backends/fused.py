"""The fused backend: an operator contracted with its projections (docs/design.md section 6).

An operator's kernel and premise are linear projections of the normalised streams. On this
path each operator becomes one multi-operand ``torch.einsum`` (whose order opt_einsum picks)
over:

* the kernel: materialised (always when it has a softmax, or when it comes from the cheap unary
  stream) or *folded*: the normalised binary stream and the projection weight as two operands;
* the premise: likewise.

Folding is chosen per tensor when the operator is compiled with the model's dimensions, by
opt_einsum's cost of the folded expression against that of materialising (projection GEMM +
contraction) at a typical shape. E.g. ``p`` then never builds its B x T x T x S premise: it
applies ``sum_w K_hw(x) W_wd`` to the binary stream per token. A folded tensor's projection bias
enters as extra, smaller einsum terms (the product of sums expanded), broadcast over the token
indices they lack. A materialised binary tensor of an attention-shaped operator is asked for
channels first, so its softmax runs over a contiguous axis.

The fused path serves bidirectional calls over the full token square: causal masks and query
rows need the kernel and premise materialised (the einsum backend).

Letters: b batch; x y a tokens; h s w channels (spec letters); d f the input channels of a
folded kernel / premise.
"""

from __future__ import annotations

import functools
import itertools
import math
from dataclasses import dataclass

import opt_einsum
import torch

from folnet.ops.backends.attention import attention_layout
from folnet.ops.backends.base import Backend, Operand, activate
from folnet.ops.primitives.sink import sink_einsum
from folnet.ops.sizes import channel_sizes
from folnet.ops.spec import ROLES, TOKEN_LETTERS, OperatorSpec
from folnet.tracing import traced

FOLD_LETTER = {"kernel": "d", "premise": "f"}


@dataclass(frozen=True)
class Term:
    """One einsum of the expanded product: which tensors enter as projection or as bias."""

    equation: str
    roles: tuple[tuple[str, str], ...]  # (role, "tensor" | "fold" | "bias") per kernel/premise
    out_letters: str  # letters of this term's result, a subsequence of the full output
    missing: str  # a reduced token letter no operand carries (its size multiplies), or ""
    permute: tuple[int, ...] | None  # einsum's output order -> out_letters (None: the same)
    path: tuple[tuple[int, int], ...] | None = None  # `pairwise_path`, for 3+ operands


@dataclass(frozen=True)
class FusedPrepared:
    """The fused backend's decisions for one compiled operator (`FusedBackend.prepare`): which of
    kernel and premise to fold, and the einsum terms of every (folded, biased) combination a
    call can hand over, each with its contraction order."""

    fold: dict[str, bool]  # by role
    terms: dict[tuple[tuple[bool, bool], tuple[bool, bool]], tuple[Term, ...]]


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


def output_letters(spec: OperatorSpec) -> str:
    """The fused path's output layout: batch, the output's tokens, then its channels."""
    return "b" + "".join(c for c in spec.output if c in TOKEN_LETTERS) + "".join(
        c for c in spec.output if c not in TOKEN_LETTERS)


@functools.lru_cache(maxsize=1024)
def term(spec: OperatorSpec, kernel_mode: str, premise_mode: str) -> Term:
    """The einsum of one product of kernel and premise modes ("tensor", "fold" or "bias")."""
    modes = {"kernel": kernel_mode, "premise": premise_mode}
    subs = _operands(spec, "kernel", kernel_mode) + _operands(spec, "premise", premise_mode)
    present = set("".join(subs))
    out_letters = "".join(c for c in output_letters(spec) if c in present)
    missing = spec.rdim if spec.rdim in TOKEN_LETTERS and spec.rdim not in present else ""
    order = _einsum_order(subs, out_letters)
    permute = None if order == out_letters else tuple(order.index(c) for c in out_letters)
    equation = ",".join(subs) + "->" + order
    return Term(equation=equation, roles=tuple(modes.items()), out_letters=out_letters,
                missing=missing, permute=permute,
                path=pairwise_path(equation) if len(subs) > 2 else None)


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


@functools.lru_cache(maxsize=1024)
def terms(spec: OperatorSpec, folded: tuple[bool, bool], biased: tuple[bool, bool]
          ) -> tuple[Term, ...]:
    """Every term of the expanded product for (kernel, premise) folded / biased: a folded
    tensor with a bias contributes a projection term and a bias term."""
    options = {r: (["fold", "bias"] if b else ["fold"]) if f else ["tensor"]
               for r, f, b in zip(ROLES, folded, biased, strict=True)}
    return tuple(term(spec, k, p) for k, p in itertools.product(options["kernel"],
                                                                 options["premise"]))


def _cost(t: Term, sizes: dict[str, int]) -> int:
    shapes = [tuple(sizes[c] for c in sub) for sub in t.equation.split("->")[0].split(",")]
    _path, info = opt_einsum.contract_path(t.equation, *shapes, shapes=True, optimize="optimal")
    return int(info.opt_cost)


@functools.lru_cache(maxsize=1024)
def fold_choice(spec: OperatorSpec, dims: tuple[tuple[str, int], ...], batch: int = 8,
              seq_len: int = 128) -> tuple[tuple[str, bool], ...]:
    """Which of kernel and premise to fold for a model of dimensions ``dims``: where opt_einsum
    costs the folded contraction below materialising (projection GEMM + contraction) at a
    typical shape. Only binary-stream tensors fold, and never a softmax kernel."""
    d = dict(dims)
    d_in = {r: d["D1"] if spec.stream(r) == "U" else d["D2"] for r in ROLES}
    sizes = {"b": batch, "x": seq_len, "y": seq_len, "a": seq_len,
             "d": d_in["kernel"], "f": d_in["premise"],
             **channel_sizes(spec.sizes, d, symbol=spec.symbol)}
    fold: dict[str, bool] = {}
    for role in ROLES:
        if spec.stream(role) != "B" or (role == "kernel" and spec.activation == "softmax"):
            fold[role] = False
            continue
        mode = {r: ("fold" if fold.get(r) else "tensor") for r in ROLES}
        as_tensor = term(spec, *({**mode, role: "tensor"}[r] for r in ROLES))
        as_fold = term(spec, *({**mode, role: "fold"}[r] for r in ROLES))
        idx = spec.tensor(role)
        width = math.prod(sizes[c] for c in idx if c not in TOKEN_LETTERS)
        tokens = math.prod(sizes[c] for c in idx if c in TOKEN_LETTERS)
        materialise = 2 * batch * tokens * sizes[FOLD_LETTER[role]] * width
        fold[role] = _cost(as_fold, sizes) < materialise + _cost(as_tensor, sizes)
    return tuple(fold.items())


@functools.lru_cache(maxsize=1024)
def pairwise_path(equation: str) -> tuple[tuple[int, int], ...]:
    """A contraction order for a term of three or more operands, chosen by opt_einsum at the
    planning sizes (batch 8, 128 tokens, channels 64): what a traced graph runs, since asking
    opt_einsum at call time (as torch.einsum does) reads every size and fixes it."""
    subs = equation.split("->")[0].split(",")
    shapes = [tuple(8 if c == "b" else 128 if c in TOKEN_LETTERS else 64 for c in sub)
              for sub in subs]
    path, _info = opt_einsum.contract_path(equation, *shapes, shapes=True, optimize="greedy")
    return tuple(tuple(step) for step in path)


def einsum_by_path(equation: str, *tensors: torch.Tensor,
                   path: tuple[tuple[int, int], ...] | None = None) -> torch.Tensor:
    """``torch.einsum(equation, *tensors)`` as the two-operand contractions of ``path``
    (`pairwise_path` when not given), each keeping only the letters a later step or the output
    needs."""
    inputs, output = equation.split("->")
    subs, ops = inputs.split(","), list(tensors)
    for step in path if path is not None else pairwise_path(equation):
        hi, lo = max(step), min(step)
        pair = [(subs[hi], ops[hi]), (subs[lo], ops[lo])]  # the later operand first
        subs = [s for k, s in enumerate(subs) if k not in step]  # no list.pop: dynamo refuses it
        ops = [t for k, t in enumerate(ops) if k not in step]
        rest = set("".join(subs)) | set(output)
        letters = "".join(dict.fromkeys(c for s, _ in pair for c in s if c in rest))
        ops.append(torch.einsum(f"{pair[0][0]},{pair[1][0]}->{letters}", pair[0][1], pair[1][1]))
        subs.append(letters)
    (last,), (op,) = subs, ops
    return op if last == output else torch.einsum(f"{last}->{output}", op)


def run_terms(plan: tuple[Term, ...], operands: dict[str, list[torch.Tensor]],
              bias: dict[str, torch.Tensor], sizes: dict[str, int],
              full_letters: str, sinks: dict[str, torch.Tensor] | None = None) -> torch.Tensor:
    """Evaluate and sum the einsum terms of one operator.

    ``operands[role]`` is ``[tensor]`` or ``[stream, weight]``; ``bias[role]`` the folded
    tensor's projection bias (channels only); ``sinks[role]`` where a materialised tensor's
    gradient is added in place (`folnet.ops.primitives.sink`: two-tensor terms only). The result
    is laid out as ``full_letters``."""
    full_shape = [sizes[c] for c in full_letters]
    is_traced = traced()
    total = None
    for t in plan:
        args = []
        for role, mode in t.roles:
            args += operands[role] if mode != "bias" else [bias[role]]
        if is_traced and len(args) > 2:
            out = einsum_by_path(t.equation, *args, path=t.path)
        elif sinks and len(args) == 2 and all(mode == "tensor" for _, mode in t.roles):
            out = sink_einsum(t.equation, *args, sinks=tuple(sinks.get(r) for r, _ in t.roles))
        else:
            out = torch.einsum(t.equation, *args)
        if t.permute is not None:
            out = out.permute(t.permute)  # a view
        if t.missing:
            out = out * sizes[t.missing]
        if t.out_letters != full_letters:  # broadcast over the token indices it lacks
            shape = [n if c in t.out_letters else 1 for c, n in zip(full_letters, full_shape,
                                                                    strict=True)]
            out = out.reshape(shape)
            if total is None:
                out = out.expand(full_shape)
        total = out if total is None else total + out
    return total


class FusedBackend(Backend):
    """Each operator one multi-operand einsum over its (possibly folded) projections."""

    name = "fused"

    def why_not_spec(self, spec, causal):
        if causal:
            return ("causal masks apply to materialised kernels and premises; the fused "
                    "contraction serves bidirectional calls")
        return None

    def why_not(self, spec, call):
        reason = self.why_not_spec(spec, call.causal)
        if reason is not None:
            return reason
        if call.rows:
            return "query rows of a longer domain need the materialised kernel and premise"
        if call.materialise:
            return "the caller asks for the materialised kernel and premise"
        if call.padded and spec.activation != "softmax" and spec.rdim in TOKEN_LETTERS:
            return "a padding mask on a reduction without softmax needs the materialised kernel"
        return None

    def prepare(self, spec, causal, dims):
        if self.why_not_spec(spec, causal) is not None:
            return None
        fold = dict(fold_choice(spec, dims)) if dims is not None else dict.fromkeys(ROLES, False)
        flags = ((False, False), (False, True), (True, False), (True, True))
        return FusedPrepared(fold, {(folded, biased): terms(spec, folded, biased)
                                for folded in flags for biased in flags})

    def layout(self, op, role):
        spec = op.spec
        if spec.stream(role) == "U":
            return "cl"
        if op.prepared["fused"].fold[role]:
            return "fold"
        return "cf" if attention_layout(spec) is not None else "cl"

    def run(self, op, kernel, premise, pad, *, order, dropout_p, premasked=frozenset()):
        spec = op.spec
        given = {"kernel": kernel, "premise": premise}
        sizes = {"b": kernel.tensor.shape[0], **kernel.sizes(), **premise.sizes()}
        operands, bias, sinks = {}, {}, {}
        for role, operand in given.items():
            if operand.folded:  # the stream (B, *tokens, D) and the weight (*channels, D)
                operands[role] = [operand.tensor, operand.weight]
                sizes.update(zip(spec.channels(role), operand.weight.shape[:-1], strict=True))
                if operand.bias is not None:
                    bias[role] = operand.bias
                continue
            t = operand.tensor
            if role == "kernel":  # activated where it lies (channels first: contiguous R-dim)
                t = activate(spec, t, operand.letters, order=None, pad=pad, dropout_p=dropout_p)
            operands[role] = [Operand(t, operand.letters).laid_out(spec.tensor(role))]
            if operand.sink is not None and t is operand.tensor:  # (not once activated)
                sinks[role] = operand.sink_laid_out(spec.tensor(role))
        plan = op.prepared["fused"].terms[(kernel.folded, premise.folded),
                                       (kernel.bias is not None, premise.bias is not None)]
        out = run_terms(plan, operands, bias, sizes, output_letters(spec), sinks)
        letters = output_letters(spec)[1:]
        return out.permute([0] + [1 + letters.index(c) for c in spec.output])  # a view

