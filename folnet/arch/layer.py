"""One dual-branch FOLNet layer: the mixer stage (all operators of the plan, read through one
fused projection per stream and written through one fused output projection per stream), then
the Boolean FFN stage on both streams. Pre-LayerNorm without affine parameters, residual adds.

Key to shapes: B batch, T tokens, D1/D2 unary/binary widths, N1/N2 the fused projection widths
(the concatenated kernel and premise channels each stream feeds), M1/M2 the concatenated
operator output channels.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from folnet.arch import kernels
from folnet.arch.config import ModelConfig
from folnet.arch.fused import FusedPlan, output_letters, plan_operator, run_terms
from folnet.arch.plan import LayerPlan
from folnet.ops import masks
from folnet.ops.backends import attention_layout
from folnet.ops.compiler import CompiledOperator, compile_operator
from folnet.ops.sizes import evaluate, evaluate_int
from folnet.ops.spec import TOKEN_LETTERS, OperatorSpec


@dataclass(frozen=True)
class Segment:
    """A kernel or premise: where its channels sit in its stream's fused projection."""

    stream: str  # "U" or "B"
    start: int
    width: int
    channels: tuple[int, ...]  # channel sizes in the spec's index-list order
    bias: bool


@dataclass(frozen=True)
class OperatorSlot:
    """Static facts of one operator inside a layer, computed once at build time."""

    spec: OperatorSpec
    kernel: Segment
    premise: Segment
    out_start: int  # offset of its output channels in its stream's fused output projection
    out_width: int
    kernel_scale: float  # applied before the softmax (softmax kernels only)
    out_scale: float  # every other constant scale, folded onto the (smaller) output


def _natural(idx: tuple[str, ...]) -> tuple[str, ...]:
    """Token letters first (in order), then channel letters (in order): how a projection lays a
    tensor out before it is permuted into the spec's index order."""
    return tuple(c for c in idx if c in TOKEN_LETTERS) + tuple(
        c for c in idx if c not in TOKEN_LETTERS)


def _perm(src: tuple[str, ...], dst: tuple[str, ...]) -> list[int] | None:
    if src == dst:
        return None
    return [0] + [1 + src.index(c) for c in dst]


class FusedProjection(nn.Module):
    """One Linear producing every segment a stream feeds; biases only where segments have one."""

    def __init__(self, d_in: int, segments: list[Segment]):
        super().__init__()
        self.width = sum(s.width for s in segments)
        self.weight = nn.Parameter(torch.empty(self.width, d_in))
        biased = [i for s in segments if s.bias for i in range(s.start, s.start + s.width)]
        self.full_bias = len(biased) == self.width
        self.bias = nn.Parameter(torch.zeros(len(biased))) if biased else None
        self.register_buffer("bias_index", torch.tensor(biased, dtype=torch.long),
                             persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        bias = self.bias
        if bias is not None and not self.full_bias:
            bias = bias.new_zeros(self.width).index_copy(0, self.bias_index, bias)
        return F.linear(x, self.weight, bias)


class FusedOutput(nn.Module):
    """One Linear over the concatenated operator outputs, one bias per operator (summed), as the
    released per-operator output Linears are."""

    def __init__(self, d_in: int, d_out: int, num_ops: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(d_out, d_in))
        self.bias = nn.Parameter(torch.zeros(num_ops, d_out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias.sum(0))


class BinaryFFN(nn.Module):
    """The binary Boolean stage: ``[u2(x,y), u2(y,x)] -> Linear -> GELU -> Linear`` plus a skip
    Linear of ``u2(y,x)``. (Measured on CPU: the explicit concatenation beats computing the
    transposed half as a transposed GEMM output -- strided adds over B x T x T x F2 cost more
    than the copy.)"""

    def __init__(self, d2: int, f2: int):
        super().__init__()
        self.inp = nn.Linear(2 * d2, f2)
        self.out = nn.Linear(f2, d2)
        self.skip = nn.Linear(d2, d2)

    def forward(self, n2: torch.Tensor) -> torch.Tensor:
        # (B, T, T, D2) -> (B, T, T, D2); see kernels.binary_ffn for the recomputing backward
        return kernels.binary_ffn(n2, self.inp.weight, self.inp.bias, self.out.weight,
                                  self.out.bias, self.skip.weight, self.skip.bias)


class UnaryFFN(nn.Module):
    def __init__(self, d1: int, f1: int):
        super().__init__()
        self.inp = nn.Linear(d1, f1)
        self.out = nn.Linear(f1, d1)

    def forward(self, n1: torch.Tensor) -> torch.Tensor:
        return self.out(F.gelu(self.inp(n1)))


def build_slots(plan: LayerPlan, cfg: ModelConfig) -> tuple[list[OperatorSlot], dict, dict]:
    """Lay every operator's kernel, premise and output channels out in the fused projections."""
    dims = cfg.dims
    offsets = {"U": 0, "B": 0}
    out_offsets = {"U": 0, "B": 0}
    segments: dict[str, list[Segment]] = {"U": [], "B": []}
    slots = []
    for spec in plan.ops:
        sizes = {c: evaluate_int(e, dims, what=f"operator {spec.symbol!r} size of {c}")
                 for c, e in spec.sizes}
        segs = {}
        for role in ("kernel", "premise"):
            stream = spec.stream(role)
            channels = tuple(sizes[c] for c in spec.channels(role))
            proj = spec.kernel_proj if role == "kernel" else spec.premise_proj
            seg = Segment(stream, offsets[stream], math.prod(channels), channels, proj.bias)
            offsets[stream] += seg.width
            segments[stream].append(seg)
            segs[role] = seg
        ks = evaluate(spec.kernel_proj.scale, dims)
        ps = evaluate(spec.premise_proj.scale, dims)
        softmax = spec.activation == "softmax"
        out_stream = spec.typing.output
        width = math.prod(sizes[c] for c in spec.channels("output"))
        slots.append(OperatorSlot(spec, segs["kernel"], segs["premise"], out_offsets[out_stream],
                                  width, ks if softmax else 1.0, ps * (1.0 if softmax else ks)))
        out_offsets[out_stream] += width
    return slots, segments, out_offsets


class FolnetLayer(nn.Module):
    """Mixer stage then FFN stage, both pre-LN with residual adds, on both streams.

    Two mixer paths compute the same function. The *fused* path (encoders, einsum backend)
    contracts each operator with its projections in one einsum (`folnet.arch.fused`), builds the
    binary-stream tensors it does materialise channels-first in one batched GEMM (so every
    softmax runs over a contiguous axis and the T x T matrix products need no transposed
    copies), and never splits a fused output by slicing. The *compiled* path (causal decoders,
    rpe*, SDPA/xformers backends) materialises every kernel and premise and calls the compiled
    operators.
    """

    def __init__(self, plan: LayerPlan, cfg: ModelConfig, *, causal: bool = False):
        super().__init__()
        self.cfg = cfg
        self.plan = plan
        self.causal = causal
        self.slots, segments, widths = build_slots(plan, cfg)
        self.proj_u = FusedProjection(cfg.D1, segments["U"]) if segments["U"] else None
        self.proj_b = FusedProjection(cfg.D2, segments["B"]) if segments["B"] else None
        self.out_u = FusedOutput(widths["U"], cfg.D1, len(plan.unary)) if plan.unary else None
        self.out_b = FusedOutput(widths["B"], cfg.D2, len(plan.binary)) if plan.binary else None
        self.ffn_u = UnaryFFN(cfg.D1, cfg.F1)
        self.ffn_b = BinaryFFN(cfg.D2, cfg.F2)
        self.kernels: list[CompiledOperator] = [
            compile_operator(slot.spec, cfg.backend, causal=causal) for slot in self.slots]
        self.dropout = nn.Dropout(cfg.dropout)
        if cfg.position == "rpe*":
            # Shaw-style static relative embeddings (paper Appendix C): keys inside `a`,
            # values inside `j`, one table per layer indexed by the clipped-distance id.
            self.rel_key = nn.Parameter(torch.empty(2 * cfg.delta + 2, cfg.S))
            self.rel_value = nn.Parameter(torch.empty(2 * cfg.delta + 2, cfg.S))
        self.fused = [self._plan_fused(slot) for slot in self.slots]
        self._out_channels = {
            slot.spec.symbol: tuple(evaluate_int(slot.spec.size_expr(c), cfg.dims, what=c)
                                    for c in slot.spec.channels("output"))
            for slot in self.slots}
        # binary-stream segments the fused path materialises (the rest are folded)
        self._mat_b = [seg for slot, fp in zip(self.slots, self.fused, strict=True)
                       for role, seg in (("kernel", slot.kernel), ("premise", slot.premise))
                       if seg.stream == "B" and not fp.folded(role)]
        unary_starts = {seg.start for slot in self.slots if slot.spec.typing.output == "U"
                        for seg in (slot.kernel, slot.premise)}
        self._mat_b_unary = [seg for seg in self._mat_b if seg.start in unary_starts]
        self._layout = {
            seg.start: "cf" if attention_layout(slot.spec) is not None else "cl"
            for slot in self.slots for seg in (slot.kernel, slot.premise) if seg.stream == "B"}

    def _plan_fused(self, slot: OperatorSlot) -> FusedPlan:
        spec, cfg = slot.spec, self.cfg
        sizes = {c: evaluate_int(e, cfg.dims, what=c) for c, e in spec.sizes}
        d_in = {r: cfg.D1 if spec.stream(r) == "U" else cfg.D2 for r in ("kernel", "premise")}
        return plan_operator(spec, sizes, d_in=d_in,
                             biases={"kernel": slot.kernel.bias, "premise": slot.premise.bias})

    def _norm(self, x: torch.Tensor, width: int) -> torch.Tensor:
        return F.layer_norm(x, (width,), eps=self.cfg.layer_norm_eps)

    @staticmethod
    def _take(part: torch.Tensor, seg: Segment, idx: tuple[str, ...]) -> torch.Tensor:
        """A segment's channels (already split off its stream's projection, channels last)
        laid out as the spec's index list."""
        x = part.unflatten(-1, seg.channels)
        perm = _perm(_natural(idx), idx)
        return x if perm is None else x.permute(perm)

    def _split(self, proj: torch.Tensor | None, stream: str) -> dict[int, torch.Tensor]:
        """Split a fused projection into its segments in one op (by start offset). Slicing
        each segment separately would make autograd zero-fill a full-width gradient per slice;
        split's backward concatenates once."""
        if proj is None:
            return {}
        segs = sorted((s for slot in self.slots for s in (slot.kernel, slot.premise)
                       if s.stream == stream), key=lambda s: s.start)
        parts = torch.split(proj, [s.width for s in segs], dim=-1)
        return {s.start: p for s, p in zip(segs, parts, strict=True)}

    # -- the fused (encoder, einsum) path --------------------------------------------------------
    def _use_fused(self, device: torch.device, pad) -> bool:
        if self.causal or self.cfg.position == "rpe*":
            return False
        for slot, kernel_fn in zip(self.slots, self.kernels, strict=True):
            if kernel_fn.backend not in ("auto", "einsum"):
                return False
            if kernel_fn.backend == "auto" and device.type != "cpu" and \
                    attention_layout(slot.spec) is not None:
                return False  # SDPA / xformers serve attention-shaped operators on GPUs
            if pad is not None and slot.spec.activation != "softmax" and \
                    slot.spec.rdim in TOKEN_LETTERS:
                return False
        return True

    def _binary_materialised(self, n2: torch.Tensor, unary_only: bool = False
                             ) -> dict[int, torch.Tensor]:
        """The binary segments the fused path materialises, {start: tensor}: channels first
        (B, C, T, T) for attention-shaped operators, channels last otherwise (only those the
        unary-output operators read, with ``unary_only``)."""
        wanted = self._mat_b_unary if unary_only else self._mat_b
        if not wanted:
            return {}
        proj = self.proj_b
        bias = None
        if proj.bias is not None:
            bias = proj.bias.new_zeros(proj.width).index_copy(0, proj.bias_index, proj.bias)
        segments = tuple((s.start, s.width, self._layout[s.start]) for s in wanted)
        outs = kernels.segmented_linear(n2, proj.weight, bias, segments)
        return {s.start: o for s, o in zip(wanted, outs, strict=True)}

    def _activate(self, slot: OperatorSlot, K: torch.Tensor, natural, pad, p: float):
        """Scale, mask, softmax and dropout of a materialised kernel in its natural layout
        ``natural`` (channels-first for the binary stream), where the R-dim is contiguous."""
        spec = slot.spec
        if slot.kernel_scale != 1.0:
            K = K * slot.kernel_scale
        if spec.activation == "softmax":
            if pad is not None and spec.rdim in TOKEN_LETTERS:
                keep = masks.kernel_keep(spec, natural, order=None, pad=pad)
                K = K.masked_fill(~keep, masks.fill_value(K.dtype))
            K = torch.softmax(K, dim=1 + natural.index(spec.rdim))
        if spec.kernel_dropout and p > 0.0:
            K = kernels.dropout(K, p, True)
        return K

    def _mixer_fused(self, u1, u2, pad, unary_only=False):
        cfg = self.cfg
        n1 = self._norm(u1, cfg.D1)
        n2 = self._norm(u2, cfg.D2)
        if n2.device.type == "cpu" and torch.is_autocast_enabled("cpu"):
            # one cast of the normalised binary stream for all its readers (the projection and
            # every folded einsum), not one per reader (and one gradient conversion per reader)
            n2 = n2.to(torch.get_autocast_dtype("cpu"))
        unary = self._split(self.proj_u(n1) if self.proj_u is not None else None, "U")
        binary = self._binary_materialised(n2, unary_only)
        B, T = n2.shape[0], n2.shape[1]
        p = cfg.kernel_dropout if self.training else 0.0
        outs: dict[str, list[torch.Tensor]] = {"U": [], "B": []}
        for slot, plan in zip(self.slots, self.fused, strict=True):
            spec = slot.spec
            if unary_only and spec.typing.output == "B":
                continue
            operands, bias = {}, {}
            for role, seg in (("kernel", slot.kernel), ("premise", slot.premise)):
                idx = spec.tensor(role)
                if plan.folded(role):  # the binary stream and the projection weight
                    w = self.proj_b.weight[seg.start : seg.start + seg.width]
                    operands[role] = [n2, w.view(*seg.channels, -1)]
                    if seg.bias:
                        full = self.proj_b.bias.new_zeros(self.proj_b.width).index_copy(
                            0, self.proj_b.bias_index, self.proj_b.bias)
                        bias[role] = full[seg.start : seg.start + seg.width].view(seg.channels)
                    continue
                if seg.stream == "U":
                    natural = _natural(idx)
                    t = unary[seg.start].unflatten(-1, seg.channels)  # (B, T, *channels)
                elif self._layout[seg.start] == "cf":  # (B, C, T, T) -> (B, *ch, row, col)
                    toks = tuple(c for c in idx if c in TOKEN_LETTERS)
                    natural = tuple(c for c in idx if c not in TOKEN_LETTERS) + toks
                    t = binary[seg.start].unflatten(1, seg.channels)
                else:  # (B, T, T, C) -> (B, row, col, *channels)
                    natural = _natural(idx)
                    t = binary[seg.start].unflatten(-1, seg.channels)
                if role == "kernel":
                    t = self._activate(slot, t, natural, pad, p)
                perm = _perm(natural, idx)
                operands[role] = [t if perm is None else t.permute(perm)]
            letters = output_letters(spec)
            ntok = sum(c in TOKEN_LETTERS for c in spec.output)
            shape = (B, *([T] * ntok), *self._out_channels[slot.spec.symbol])
            out = run_terms(plan, operands, bias, shape, letters)  # (B, T[, T], *channels)
            out = out.flatten(1 + ntok)  # (B, T[, T], width)
            if slot.out_scale != 1.0:
                out = out * slot.out_scale
            outs[spec.typing.output].append(out)
        return self._write(u1, u2, outs)

    def _write(self, u1, u2, outs):
        """One fused output projection per stream over the concatenated operator outputs, then
        dropout and the residual add."""
        if outs["U"]:
            u1 = kernels.dropout_add(u1, self.out_u(torch.cat(outs["U"], -1)), self.cfg.dropout,
                                     self.training)  # (B, T, D1)
        if outs["B"]:
            cat = torch.cat(outs["B"], -1)  # (B, T, T, M2)
            update = kernels.linear(cat, self.out_b.weight, self.out_b.bias.sum(0))
            u2 = kernels.dropout_add(u2, update, self.cfg.dropout, self.training)  # (B,T,T,D2)
        return u1, u2

    # -- the compiled path -----------------------------------------------------------------------
    def _mixer_compiled(self, u1, u2, pad, rel_ids, visible=None, unary_only=False):
        n1 = self._norm(u1, self.cfg.D1)
        n2 = self._norm(u2, self.cfg.D2)
        parts = {
            "U": self._split(self.proj_u(n1) if self.proj_u is not None else None, "U"),
            "B": self._split(self.proj_b(n2) if self.proj_b is not None else None, "B"),
        }  # (B, T, N1) and (B, T, T, N2) split into the operators' segments
        outs: dict[str, list[torch.Tensor]] = {"U": [], "B": []}
        p = self.cfg.kernel_dropout if self.training else 0.0
        for slot, kernel_fn in zip(self.slots, self.kernels, strict=True):
            spec = slot.spec
            if unary_only and spec.typing.output == "B":
                continue
            K = self._take(parts[slot.kernel.stream][slot.kernel.start], slot.kernel, spec.kernel)
            v = self._take(parts[slot.premise.stream][slot.premise.start], slot.premise,
                           spec.premise)
            if slot.kernel_scale != 1.0:
                K = K * slot.kernel_scale
            kwargs = {"visible": visible} if self.causal and visible is not None else {}
            out = kernel_fn(K, v, pad, dropout_p=p if spec.kernel_dropout else 0.0, **kwargs)
            if self.cfg.position == "rpe*":
                out = out + self._static_relative(spec, K, rel_ids, pad)
            perm = _perm(spec.output, _natural(spec.output))
            out = (out if perm is None else out.permute(perm)).flatten(-len(spec.channels(
                "output")))  # (B, T[, T], width)
            if slot.out_scale != 1.0:
                out = out * slot.out_scale
            outs[spec.typing.output].append(out)
        return self._write(u1, u2, outs)

    def mixer(self, u1, u2, pad=None, rel_ids=None, visible=None, unary_only=False):
        """u1 (B, T, D1), u2 (B, T, T, D2) -> both updated by every operator of the plan (with
        ``unary_only``, only u1 by the unary-output operators; u2 is returned as it came)."""
        if visible is None and self._use_fused(u1.device, pad):
            return self._mixer_fused(u1, u2, pad, unary_only)
        return self._mixer_compiled(u1, u2, pad, rel_ids, visible, unary_only)

    def _static_relative(self, spec, K, rel_ids, pad):
        """RPE*: the degenerate m (in j) and p (in a) with static per-distance embeddings."""
        if spec.name == "join":  # + sum_a softmax(K_h(x, a)) r_s(id(x, a))
            order = masks.tril(K.shape[1], K.device) if self.causal else None
            keep = masks.kernel_keep(spec, spec.kernel, order=order, pad=pad)
            if keep is not None:
                K = K.masked_fill(~keep, masks.fill_value(K.dtype))
            probs = torch.softmax(K, dim=2)  # (B, X, A, H)
            onehot = F.one_hot(rel_ids, self.rel_value.shape[0]).to(probs.dtype)  # (B,X,A,R)
            return torch.einsum("bxah,bxar,rs->bxhs", probs, onehot, self.rel_value)
        if spec.name == "assoc":  # + sum_w q_hw(x) r_w(id(x, y))
            scores = torch.einsum("bxhw,rw->bxhr", K, self.rel_key)  # (B, X, H, R)
            index = rel_ids.unsqueeze(2).expand(-1, -1, scores.shape[2], -1)  # (B, X, H, Y)
            # (B, X, Y, H); the operator's constant scale is applied to the sum by the caller
            return scores.gather(3, index).permute(0, 1, 3, 2)
        return 0.0

    def forward(self, u1, u2, pad=None, rel_ids=None, visible=None, unary_only=False):
        """One layer. ``unary_only`` (the last layer, when nothing reads the final binary
        stream) skips every update of u2 -- the binary-output operators and the binary FFN --
        and returns None in its place: work whose result no loss would see."""
        u1, u2 = self.mixer(u1, u2, pad, rel_ids, visible, unary_only)
        u1 = kernels.dropout_add(u1, self.ffn_u(self._norm(u1, self.cfg.D1)), self.cfg.dropout,
                                 self.training)
        if unary_only:
            return u1, None
        u2 = kernels.dropout_add(u2, self.ffn_b(self._norm(u2, self.cfg.D2)), self.cfg.dropout,
                                 self.training)
        return u1, u2
