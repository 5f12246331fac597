"""The dual-stream FOLNet layer, one implementation for every kind of model.

Mixer stage: normalise both streams (LayerNorm without affine parameters), read each through
one fused projection, run every operator of the plan, write each stream through one fused
output projection (dropout, residual add). FFN stage: the Boolean FFN on both streams, likewise.
The operators run over a `Domain`: the full bidirectional square (encoders), a causal square
with a visibility matrix (decoders), or query rows of a longer domain (an encoder-decoder's
targets, cached generation). Which backend runs an operator is the compiled operator's choice
(`folnet.ops.compiler`); the layer hands it the projected kernel and premise in the layout that
backend asks for -- channels last, channels first, or folded (never materialised).

A causal layer (paper Appendix A.5) also keeps its binary atoms lower-triangular (multiplied by
the visibility after every residual update) and applies each operator in its causal form
(`folnet.ops.masks.causal_form`). Tensors indexed by a position other than the query row --
``j``'s and ``a``'s unary premises, ``c``'s kernel, ``t``'s premise v(a, y) -- are its *context
channels*: a generation cache stores them per position, and an encoder-decoder's decoder gets
the encoder's through ``cross_u`` / ``cross_b`` (Linear projections of the encoder's final
atoms: "a concatenation of the unary atoms from the encoder output (with a linear projection)
and the decoder premises").

Key to shapes: B batch, Q query rows, n tokens of the domain (Q = n = T for a square),
D1/D2 stream widths, Wu/Wb context widths, M1/M2 concatenated operator outputs.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from folnet.arch.config import ModelConfig
from folnet.arch.domain import ContextHook, Domain
from folnet.arch.ffn import BinaryFFN, UnaryFFN
from folnet.arch.memory import block_rows_for
from folnet.arch.plan import LayerPlan
from folnet.arch.relative import static_relative
from folnet.arch.slots import STREAMS, FusedOutput, FusedProjection, Segment, build_slots, natural
from folnet.ops import Operand, compile_operator, masks
from folnet.ops.kernels import dropout_add, linear, segmented_linear


class DualStreamLayer(nn.Module):
    """Mixer stage then FFN stage, both pre-LN with residual adds, on both streams."""

    def __init__(self, plan: LayerPlan, cfg: ModelConfig, *, causal: bool = False,
                 cross: bool = False):
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
        self.memory_mode, self.block_rows = "auto", None  # `folnet.arch.memory.set_memory`
        self.ops = [compile_operator(masks.causal_form(s.spec) if causal else s.spec,
                                     cfg.backend, causal=causal, dims=cfg.dims)
                    for s in self.slots]
        if cfg.position == "rpe*":  # one table per layer for keys (in a), values (in j)
            self.rel_key = nn.Parameter(torch.empty(2 * cfg.delta + 2, cfg.S))
            self.rel_value = nn.Parameter(torch.empty(2 * cfg.delta + 2, cfg.S))
        # causal layers: where each context tensor sits in its stream's context buffer
        self.context: dict[tuple[int, str], int] = {}
        width = {"U": 0, "B": 0}
        for i, op in enumerate(self.ops):
            for role in ("kernel", "premise"):
                if causal and op.spec.tokens(role)[0] != masks.query_letter(op.spec):
                    seg = self.slots[i].segment(role)
                    self.context[i, role] = width[seg.stream]
                    width[seg.stream] += seg.width
        self.width_u, self.width_b = width["U"], width["B"]
        self.cross_u = nn.Linear(cfg.D1, self.width_u) if cross and self.width_u else None
        self.cross_b = nn.Linear(cfg.D2, self.width_b) if cross and self.width_b else None

    def _norm(self, x: torch.Tensor, width: int) -> torch.Tensor:
        return F.layer_norm(x, (width,), eps=self.cfg.layer_norm_eps)

    # -- projections -----------------------------------------------------------------------------
    def _project(self, n1, n2, layouts, wanted):
        """The materialised kernels and premises, {(slot, role): Operand}: the unary stream
        through its fused Linear, split once; the binary one likewise when every segment is
        wanted channels last, else through one segmented projection of just the segments
        some backend materialises (`folnet.ops.kernels.segmented_linear`), each in its
        layout."""
        parts: dict[tuple[int, str], Operand] = {}
        roles = ("kernel", "premise")
        if self.proj_u is not None:
            segs = [(i, r, s.segment(r)) for i, s in enumerate(self.slots) for r in roles
                    if s.segment(r).stream == "U"]
            splits = torch.split(self.proj_u(n1), [seg.width for *_, seg in segs], dim=-1)
            for (i, role, seg), t in zip(segs, splits, strict=True):
                if i in wanted:  # (B, Q, w) -> (B, Q, *channels)
                    idx = self.slots[i].spec.tensor(role)
                    parts[i, role] = Operand(t.unflatten(-1, seg.channels), natural(idx))
        binary = [(i, r, self.slots[i].segment(r)) for i in wanted for r in roles
                  if self.slots[i].segment(r).stream == "B" and layouts[i][r] != "fold"]
        if not binary:
            return parts
        widths = [seg.width for *_, seg in binary]
        if sum(widths) == self.proj_b.width and all(layouts[i][r] == "cl" for i, r, _ in binary):
            outs = torch.split(self.proj_b(n2), widths, dim=-1)  # (B, Q, n, w) each
        else:
            outs = segmented_linear(n2, self.proj_b.weight, self.proj_b.full(), tuple(
                (seg.start, seg.width, layouts[i][r]) for i, r, seg in binary))
        for (i, role, seg), t in zip(binary, outs, strict=True):
            idx = self.ops[i].spec.tensor(role)
            if layouts[i][role] == "cf":  # (B, C, Q, n) -> (B, *channels, row, col)
                letters = natural(idx)[2:] + natural(idx)[:2]
                parts[i, role] = Operand(t.unflatten(1, seg.channels), letters)
            else:  # (B, Q, n, C) -> (B, row, col, *channels)
                parts[i, role] = Operand(t.unflatten(-1, seg.channels), natural(idx))
        return parts

    def _folded(self, i: int, role: str, n2: torch.Tensor) -> Operand:
        """A binary tensor handed over folded: the normalised stream and its weight rows."""
        seg: Segment = self.slots[i].segment(role)
        w = self.proj_b.weight[seg.start : seg.start + seg.width].view(*seg.channels, -1)
        bias = self.proj_b.full()
        if seg.bias:
            bias = bias[seg.start : seg.start + seg.width].view(seg.channels)
        idx = self.ops[i].spec.tensor(role)
        return Operand(n2, natural(idx)[:2], weight=w, bias=bias if seg.bias else None)

    def cross_context(self, enc_u: torch.Tensor, enc_b: torch.Tensor
                      ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """Encoder atoms (B, N, D1), (B, N, N, D2) -> context rows (B, N, Wu), (B, N, N, Wb)
        (every input pair is visible: nothing to mask)."""
        cu = self.cross_u(enc_u) if self.cross_u is not None else None
        cb = self.cross_b(enc_b) if self.cross_b is not None else None
        return cu, cb

    def _context(self, parts, keep, hook: ContextHook):
        """Hand the rows' context channels to ``hook``; returns the operands read from the
        buffers it gives back, {(slot, role): Operand}, and which of them are premasked."""
        own = {}
        for stream in STREAMS:
            keys = [k for k in self.context if self.slots[k[0]].segment(k[1]).stream == stream]
            if keys:  # (B, Q, [n,] W) in context order
                own[stream] = torch.cat([parts[k].tensor.flatten(-len(
                    self.slots[k[0]].segment(k[1]).channels)) for k in keys], -1)
        if "B" in own:
            own["B"] = own["B"] * keep  # (B, Q, n, Wb): the pairs the rows see
        buffers = hook(own.get("U"), own.get("B"))
        if buffers is None:
            return {}, {}
        taken, premasked = {}, {}
        for (i, role), start in self.context.items():
            seg, spec = self.slots[i].segment(role), self.ops[i].spec
            buf = buffers[STREAMS.index(seg.stream)]  # (B, n, [n,] W)
            t = buf[..., start : start + seg.width].unflatten(-1, seg.channels)
            taken[i, role] = Operand(t, natural(spec.tensor(role)))
            if seg.stream == "B" and (role == "premise" or spec.activation != "softmax"):
                premasked.setdefault(i, set()).add(role)
        return taken, premasked

    # -- the layer ---------------------------------------------------------------------------------
    def forward(self, u1: torch.Tensor, u2: torch.Tensor, domain: Domain, *,
                context: ContextHook | None = None, unary_only: bool = False
                ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """u1 (B, Q, D1), u2 (B, Q, n, D2) -> both updated. ``unary_only`` (the last layer, when
        nothing reads the final binary stream) skips every update of u2 -- the binary-output
        operators and the binary FFN -- and returns None in its place."""
        cfg = self.cfg
        n1, n2 = self._norm(u1, cfg.D1), self._norm(u2, cfg.D2)
        if n2.device.type == "cpu" and torch.is_autocast_enabled("cpu"):
            # one cast of the normalised binary stream for all its readers (the projection and
            # every folded einsum), not one per reader (and one gradient conversion per reader)
            n2 = n2.to(torch.get_autocast_dtype("cpu"))
        wanted = [i for i, s in enumerate(self.slots)
                  if not (unary_only and s.spec.typing.output == "B")]
        backends, layouts = {}, {}
        for i in wanted:
            op = self.ops[i]
            # rpe*'s static terms dominate its layers' cost (the fused path measured 1.02x
            # there): they keep every kernel and premise materialised, as before
            call = op.call(n2, padded=domain.pad is not None, rows=domain.rows is not None,
                           requires_grad=torch.is_grad_enabled(),
                           materialise=cfg.position == "rpe*")
            backends[i] = op.select(call)
            layouts[i] = {r: backends[i].layout(op, r) for r in ("kernel", "premise")}
        parts = self._project(n1, n2, layouts, wanted)
        keep = domain.keep()  # (B|1, Q, n, 1) or None
        taken, premasked = self._context(parts, keep, context) if context else ({}, {})
        p = cfg.kernel_dropout if self.training else 0.0
        outs: dict[str, list[torch.Tensor]] = {"U": [], "B": []}
        for i in wanted:
            slot, op = self.slots[i], self.ops[i]
            spec = op.spec
            K, v = (taken.get((i, r)) or parts.get((i, r)) or self._folded(i, r, n2)
                    for r in ("kernel", "premise"))
            if slot.kernel_scale != 1.0:
                K = Operand(K.tensor * slot.kernel_scale, K.letters)
            order = domain.order(masks.query_letter(spec))
            out = op.run(K, v, domain.pad, order=order, backend=backends[i],
                         dropout_p=p if spec.kernel_dropout else 0.0,
                         premasked=frozenset(premasked.get(i, ())))  # spec.output layout
            if cfg.position == "rpe*":
                out = out + static_relative(spec, K.laid_out(spec.kernel), domain,
                                            self.rel_key, self.rel_value)
            letters = natural(spec.output)
            out = out.permute([0] + [1 + spec.output.index(c) for c in letters])
            out = out.flatten(-len(slot.out_channels))  # (B, Q[, n], width)
            if slot.out_scale != 1.0:
                out = out * slot.out_scale
            outs[spec.typing.output].append(out)
        u1, u2 = self._write(u1, u2, outs, keep)
        u1 = dropout_add(u1, self.ffn_u(self._norm(u1, cfg.D1)), cfg.dropout, self.training)
        if unary_only:
            return u1, None
        n2 = self._norm(u2, cfg.D2)
        # a full square (bidirectional or causal: u2 is masked, so its transpose is n2's) may
        # run in blocks of rows; query rows of a longer domain pass their transposed input
        rows = (None if domain.rows is not None
                else block_rows_for(n2.shape[1], self.memory_mode, self.block_rows))
        ffn = (self.ffn_b(n2, block_rows=rows) if rows is not None
               else self.ffn_b(n2, domain.transposed(n2)))
        u2 = dropout_add(u2, ffn, cfg.dropout, self.training)
        return u1, (u2 if keep is None else u2 * keep)

    def _write(self, u1, u2, outs, keep):
        """One fused output projection per stream over the concatenated operator outputs, then
        dropout and the residual add (and the visibility, causally)."""
        if outs["U"]:
            u1 = dropout_add(u1, self.out_u(torch.cat(outs["U"], -1)), self.cfg.dropout,
                             self.training)  # (B, Q, D1)
        if outs["B"]:
            cat = torch.cat(outs["B"], -1)  # (B, Q, n, M2)
            # the CPU fast product (`folnet.ops.kernels.linear`) on the bidirectional square;
            # causal layers keep the plain product their checkpoints' outputs were made with
            # (the two round differently: ~1e-7 relative)
            update = (linear(cat, self.out_b.weight, self.out_b.bias.sum(0)) if keep is None
                      else self.out_b(cat))
            u2 = dropout_add(u2, update, self.cfg.dropout, self.training)  # (B, Q, n, D2)
            if keep is not None:
                u2 = u2 * keep
        return u1, u2
