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

The stages talk by name: one `LayerCall` per call holds what it decided (the domain, the
`Dispatch` -- which operators, on which routes --, the visible pairs, the blocks of query rows,
the context hand-off), operands are keyed by (slot, role). Each stage is its equation
(`folnet.arch.layer.mixer.mix`, `unary_ffn_stage`, `binary_ffn_stage`: docs/design.md section
1); `forward` hands a long input on a CPU to the blocked runner instead
(`folnet.arch.layer.row_blocks`). The mixer runs through `project` -> `operate` -> `updates`
either way.

Key to shapes: B batch, Q query rows, n tokens of the domain (Q = n = T for a square),
D1/D2 stream widths, Wu/Wb context widths, M1/M2 concatenated operator outputs.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import nn

from folnet.arch import adapters
from folnet.arch.config import ModelConfig
from folnet.arch.layer.context import context_offsets, take_context
from folnet.arch.layer.dispatch import ROLES, Dispatch, Key, Parts, Premasked
from folnet.arch.layer.domain import ContextHook, Domain
from folnet.arch.layer.ffn import BinaryFFN, UnaryFFN
from folnet.arch.layer.memory_modes import block_reach, block_rows_for, releases_heap
from folnet.arch.layer.mixer import LayerCall, Residual, mix
from folnet.arch.layer.relative import check_static_relative, static_relative
from folnet.arch.layer.row_blocks import ffn_blocks, mix_blocks
from folnet.arch.layer.slots import (
    STREAMS,
    FusedOutput,
    FusedProjection,
    Segment,
    build_slots,
    natural,
)
from folnet.arch.plan import LayerPlan
from folnet.ops import Operand, compile_operator, masks
from folnet.ops.backends import BACKENDS
from folnet.ops.primitives import layer_norm, linear, segmented_linear
from folnet.ops.primitives.autocast import autocast_dtype
from folnet.ops.primitives.device import kernel_device
from folnet.ops.primitives.residual_norm import why_not as fused_norm_why_not
from folnet.tracing import traced


def _apply(fused: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """A fused Linear as a function, not a module call: inside a recomputed block (an autograd
    Function's forward) module hooks, such as FlopCounterMode's, must not run. Its weight comes
    through `folnet.arch.adapters` (a LoRA adapter's update included)."""
    return F.linear(x, adapters.weight(fused), adapters.bias(fused))


class DualStreamLayer(nn.Module):
    """Mixer stage then FFN stage, both pre-LN with residual adds, on both streams."""

    def __init__(self, plan: LayerPlan, cfg: ModelConfig, *, causal: bool = False,
                 cross: bool = False) -> None:
        super().__init__()
        self.cfg = cfg
        self.plan = plan
        self.causal = causal
        self.slots, segments, widths = build_slots(plan, cfg)
        self.proj_u = FusedProjection(cfg.D1, segments["U"]) if segments["U"] else None
        self.proj_b = FusedProjection(cfg.D2, segments["B"]) if segments["B"] else None
        outputs = {stream: tuple((s.spec.symbol, s.out_width) for s in self.slots
                                 if s.spec.typing.output == stream) for stream in STREAMS}
        self.out_u = FusedOutput(widths["U"], cfg.D1, outputs["U"]) if plan.unary else None
        self.out_b = FusedOutput(widths["B"], cfg.D2, outputs["B"]) if plan.binary else None
        # which streams' outputs carry constant scales (a and p: S^-1/2), applied per channel
        # through the output projection (`updates`), not per element of their outputs
        self.out_scaled = {stream: any(s.out_scale != 1.0 for s in self.slots
                                       if s.spec.typing.output == stream) for stream in STREAMS}
        self.ffn_u = UnaryFFN(cfg.D1, cfg.F1)
        self.ffn_b = BinaryFFN(cfg.D2, cfg.F2)
        # set by `folnet.arch.layer.memory_modes.set_memory`
        self.memory_mode, self.block_rows = "auto", None
        self.ops = [compile_operator(masks.causal_form(s.spec) if causal else s.spec,
                                     cfg.backend, causal=causal, dims=cfg.dims)
                    for s in self.slots]
        # what every call would otherwise look up again, decided here once: each operand's
        # segment of its stream's projection and index letters per layout, and each operator's
        # query letter and output pattern (spec.output's letters -> tokens, channels flattened)
        self.segments: dict[Key, Segment] = {(i, r): s.segment(r) for i, s in enumerate(self.slots)
                                             for r in ROLES}
        self._letters = {(key, layout): self._letters_of(key, layout)
                         for key in self.segments for layout in ("cl", "cf")}
        self._query = [masks.query_letter(op.spec) for op in self.ops]
        self._kernel_dropout = cfg.kernel_dropout  # (the config is frozen)
        self._out_pattern = [f"batch {' '.join(op.spec.output)} -> batch "
                             f"{' '.join(op.spec.tokens('output'))} "
                             f"({' '.join(op.spec.channels('output'))})" for op in self.ops]
        if cfg.position == "rpe*":  # one table per layer for keys (in a), values (in j)
            self.rel_key = nn.Parameter(torch.empty(2 * cfg.delta + 2, cfg.S))
            self.rel_value = nn.Parameter(torch.empty(2 * cfg.delta + 2, cfg.S))
            for op in self.ops:  # an attention operator rpe* cannot read is refused here
                check_static_relative(op.spec, cfg.dims)
        # causal layers: where each context tensor sits in its stream's context buffer
        self.context, width = (context_offsets(self.ops, self._query, self.segments) if causal
                               else ({}, {"U": 0, "B": 0}))
        self.width_u, self.width_b = width["U"], width["B"]
        # what a block of query rows reads of each operand, for all operators and for a
        # unary_only call's (fixed per layer: `folnet.arch.layer.memory_modes.block_reach`)
        self._reach = {wanted: block_reach({i: self.ops[i].spec for i in wanted})
                       for wanted in {self._wanted(False), self._wanted(True)}}
        self.cross_u = nn.Linear(cfg.D1, self.width_u) if cross and self.width_u else None
        self.cross_b = nn.Linear(cfg.D2, self.width_b) if cross and self.width_b else None

    def extra_repr(self) -> str:
        return (f"ops={self.plan}, causal={self.causal}, memory={self.memory_mode!r}"
                + ("" if self.block_rows is None else f", block_rows={self.block_rows}"))

    def _norm(self, x: torch.Tensor, width: int) -> torch.Tensor:
        return layer_norm(x, width, self.cfg.layer_norm_eps)

    def norm_unary(self, u1: torch.Tensor) -> torch.Tensor:
        """LN of the unary stream (B, Q, D1)."""
        return self._norm(u1, self.cfg.D1)

    def norm_binary(self, u2: torch.Tensor) -> torch.Tensor:
        """LN of the binary stream (or of a slab of it: LN is per pair), cast once under CPU
        autocast for all its readers (the projection and every folded einsum), not once per
        reader (and one gradient conversion per reader)."""
        n2 = self._norm(u2, self.cfg.D2)
        dtype = autocast_dtype(n2.device)
        return n2 if dtype is None else n2.to(dtype)

    # -- projections -----------------------------------------------------------------------------
    def project(self, n1: torch.Tensor | None, n2: torch.Tensor, dispatch: Dispatch,
                keys: Sequence[Key]) -> Parts:
        """The kernels and premises ``keys`` name, as Operands: unary ones from ``n1`` through
        the stream's fused Linear, split once; binary ones from ``n2`` likewise when every
        segment is wanted channels last, else through one segmented projection of just the
        segments some backend materialises (`folnet.ops.primitives.segmented_linear`), each in
        its layout; folded ones as the stream and their weight rows (`folded`)."""
        layouts = dispatch.layouts
        parts: Parts = {}
        streams = {k: self.segments[k].stream for k in keys}
        if "U" in streams.values():
            segs = [(k, seg) for k, seg in self.segments.items() if seg.stream == "U"]
            splits = torch.split(_apply(self.proj_u, n1), [seg.width for _, seg in segs], dim=-1)
            for (key, seg), t in zip(segs, splits, strict=True):
                if key in streams:  # (B, Q, w) -> (B, Q, *channels)
                    parts[key] = Operand(t.unflatten(-1, seg.channels), self.letters(key, "cl"))
        binary = []
        for key in keys:
            if streams[key] != "B":
                continue
            if layouts[key] == "fold":
                parts[key] = self.folded(key, n2)
            else:
                binary.append((key, self.segments[key]))
        if not binary:
            return parts
        widths = [seg.width for _, seg in binary]
        proj_b = self.proj_b
        if sum(widths) == adapters.unwrap(proj_b).width and all(
                layouts[key] == "cl" for key, _ in binary):
            outs = torch.split(_apply(proj_b, n2), widths, dim=-1)  # (B, Q, n, w) each
        else:
            outs = segmented_linear(n2, adapters.weight(proj_b), adapters.bias(proj_b), tuple(
                (seg.start, seg.width, layouts[key]) for key, seg in binary))
        for (key, seg), t in zip(binary, outs, strict=True):
            # (B, C, Q, n) -> (B, *channels, row, col) or (B, Q, n, C) -> (B, row, col, *channels)
            t = t.unflatten(1 if layouts[key] == "cf" else -1, seg.channels)
            parts[key] = Operand(t, self.letters(key, layouts[key]))
        return parts

    def letters(self, key: Key, layout: str) -> tuple[str, ...]:
        """The index letters of a projected tensor as `project` lays it out."""
        return self._letters[key, layout]

    def _letters_of(self, key: Key, layout: str) -> tuple[str, ...]:
        i, role = key
        idx = natural(self.ops[i].spec.tensor(role))
        return idx[2:] + idx[:2] if layout == "cf" else idx  # channels, then the two tokens

    def folded(self, key: Key, n2: torch.Tensor) -> Operand:
        """A binary tensor handed over folded: the normalised stream and its weight rows."""
        i, role = key
        seg: Segment = self.segments[key]
        w = adapters.weight(self.proj_b)[seg.start : seg.start + seg.width].view(*seg.channels,
                                                                                  -1)
        bias = adapters.bias(self.proj_b)
        if seg.bias:
            bias = bias[seg.start : seg.start + seg.width].view(seg.channels)
        tokens = natural(self.ops[i].spec.tensor(role))[:2]  # (row, col) of the pair
        return Operand(n2, tokens, weight=w, bias=bias if seg.bias else None)

    def cross_context(self, enc_u: torch.Tensor, enc_b: torch.Tensor
                      ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """Encoder atoms (B, N, D1), (B, N, N, D2) -> context rows (B, N, Wu), (B, N, N, Wb)
        (every input pair is visible: nothing to mask)."""
        cu = self.cross_u(enc_u) if self.cross_u is not None else None
        cb = self.cross_b(enc_b) if self.cross_b is not None else None
        return cu, cb

    def take_context(self, parts: Parts, keep: torch.Tensor | None, hook: ContextHook
                     ) -> tuple[Parts, Premasked]:
        """The context hand-off of this call's rows (`folnet.arch.layer.context`)."""
        return take_context(self.context, self.segments, self.ops, parts, keep, hook)

    # -- the layer ---------------------------------------------------------------------------------
    def forward(self, u1: torch.Tensor, u2: torch.Tensor, domain: Domain, *,
                context: ContextHook | None = None, unary_only: bool = False,
                attentions: dict[str, torch.Tensor] | None = None
                ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """u1 (B, Q, D1), u2 (B, Q, n, D2) -> both updated. ``unary_only`` (the last layer, when
        nothing reads the final binary stream) skips every update of u2 -- the binary-output
        operators and the binary FFN -- and returns None in its place. Long enough inputs run
        the mixer and the binary FFN in blocks of query rows (`folnet.arch.layer.memory_modes`), but
        for a call that asks for ``attentions``: that dict gets each softmax operator's
        activated kernel over the whole square, by symbol."""
        call = self.begin(u2, domain, context, unary_only, attentions)
        u1, u2, n2 = (mix_blocks if call.recompute else mix)(self, call, u1, u2)
        u1 = self.unary_ffn_stage(u1, call)
        if unary_only:
            return u1, None
        return u1, (self.binary_ffn_stage(u2, call, n2) if call.ffn_rows is None
                    else ffn_blocks(self, call, u2))

    def begin(self, u2: torch.Tensor, domain: Domain,
              context: ContextHook | None, unary_only: bool,
              attentions: dict[str, torch.Tensor] | None) -> LayerCall:
        """What this call decides before it computes anything (`LayerCall`): the operators and
        their routes, and the blocks of query rows of each stage (none while ``attentions``
        are asked for: they are returned over the whole square)."""
        pairs = u2.shape[0] * u2.shape[2]  # B x n per query row
        rows = {stage: None if attentions is not None else block_rows_for(
            u2.shape[1], self.memory_mode, self.block_rows, row_pairs=pairs, stage=stage,
            device_type=kernel_device(u2.device)) for stage in ("mixer", "ffn")}
        count, step = u2.shape[1], rows["mixer"]
        # the whole square is one span, written without a range over its (maybe symbolic,
        # while exporting) length
        spans = ((0, count),) if step is None else tuple(
            (r0, min(count, r0 + step)) for r0 in range(0, count, step))
        dtype = autocast_dtype(u2.device)  # the normalised stream's: its operators' calls
        like = u2 if dtype is None else u2.new_empty((), dtype=dtype)
        # one pass for the mixer's binary residual and the FFN's norm: a whole bidirectional
        # square whose FFN runs (`folnet.ops.primitives.residual_norm.why_not` says the rest)
        fuse = (rows["mixer"] is None and rows["ffn"] is None and domain.rows is None
                and not unary_only and fused_norm_why_not(
                    u2, u2, causal=domain.causal,
                    p=self.cfg.dropout if self.training else 0.0) is None)
        return LayerCall(domain=domain, dispatch=self.dispatch(like, domain, unary_only,
                                                               recording=attentions is not None),
                         visible=domain.keep(), spans=spans,
                         ffn_rows=rows["ffn"] if domain.rows is None else None,
                         context=context, attentions=attentions,
                         p=self.cfg.dropout if self.training else 0.0,
                         recompute=rows["mixer"] is not None,
                         release_heap=(rows["mixer"] is not None
                                       and releases_heap(self.memory_mode,
                                                         kernel_device(u2.device))),
                         fuse_norm=fuse)

    def unary_ffn_stage(self, u1: torch.Tensor, call: LayerCall) -> torch.Tensor:
        """The unary Boolean stage as its equation, ``u1 + drop(ffn_u(LN u1))`` on u1
        (B, Q, D1)."""
        return Residual.draw(u1, call.p).add(u1, self.ffn_u(self.norm_unary(u1)))

    def binary_ffn_stage(self, u2: torch.Tensor, call: LayerCall,
                         n2: torch.Tensor | None = None) -> torch.Tensor:
        """The binary Boolean stage as its equation, ``u2 + drop(ffn_b(LN u2))`` on u2
        (B, Q, n, D2); ``n2``: LN u2 made already (the mixer's fused norm). Query rows of a
        longer domain pass their transposed input. (Long inputs on a CPU run it in blocks of
        rows instead: `folnet.arch.layer.row_blocks.ffn_blocks`.)"""
        drop_b = Residual.draw(u2, call.p)
        n2 = self._norm(u2, self.cfg.D2) if n2 is None else n2
        u2 = drop_b.add(u2, self.ffn_b(n2, call.domain.transposed(n2)))
        return u2 if call.visible is None else u2 * call.visible  # causal: kept triangular

    def _wanted(self, unary_only: bool) -> tuple[int, ...]:
        """The slots a call runs: all, or (``unary_only``) the unary-output operators."""
        return tuple(i for i, s in enumerate(self.slots)
                     if not (unary_only and s.spec.typing.output == "B"))

    def reach(self, wanted: tuple[int, ...]) -> dict[str, list[Key]]:
        """What a block of rows reads of each operand of the ``wanted`` operators."""
        return self._reach[wanted]

    def dispatch(self, n2: torch.Tensor, domain: Domain, unary_only: bool = False, *,
                 recording: bool = False) -> Dispatch:
        """Which operators this call runs, and the route each takes (backend and layouts).
        ``recording`` (output_attentions): the softmax operators take the reference einsum
        route, whose activated kernel is returned as computed (`CompiledOperator.run_recorded`)."""
        wanted = self._wanted(unary_only)
        routes = {}
        for i in wanted:
            op = self.ops[i]
            if recording and op.spec.activation == "softmax":
                routes[i] = op.route_by(BACKENDS["einsum"])
                continue
            # rpe*'s static terms dominate its layers' cost, so fusing gains next to nothing there
            # (docs/results/measurements.md): they keep every kernel and premise materialised.
            # A block of a bidirectional square's rows is a plain rectangular call: no mask runs
            # along rows
            routes[i] = op.route(op.describe_call(n2, padded=domain.pad is not None,
                                                  rows=domain.rows is not None,
                                                  requires_grad=torch.is_grad_enabled(),
                                                  materialise=self.cfg.position == "rpe*"))
        return Dispatch.of(wanted, routes)

    def operate(self, parts: Parts, dispatch: Dispatch, domain: Domain, premasked: Premasked,
                attentions: dict[str, torch.Tensor] | None = None
                ) -> dict[str, list[torch.Tensor]]:
        """Every wanted operator on its kernel and premise: {stream: [(B, Q[, n], width)]};
        ``attentions`` (a dict) also gets each softmax operator's activated kernel."""
        cfg = self.cfg
        p = self._kernel_dropout if self.training else 0.0
        outs: dict[str, list[torch.Tensor]] = {"U": [], "B": []}
        for i in dispatch.wanted:
            slot, op = self.slots[i], self.ops[i]
            spec = op.spec
            K, v = parts[i, "kernel"], parts[i, "premise"]
            if slot.kernel_scale != 1.0:
                K = Operand(K.tensor * slot.kernel_scale, K.letters)
            order = domain.order(self._query[i])
            masked = premasked.get(i, frozenset())
            drop = p if spec.kernel_dropout else 0.0
            if attentions is not None and spec.activation == "softmax":  # on the output's path
                out, attentions[spec.symbol] = op.run_recorded(
                    K, v, domain.pad, order=order, dropout_p=drop, premasked=masked)
            else:
                out = op.run(K, v, domain.pad, order=order, route=dispatch.routes[i],
                             dropout_p=drop, premasked=masked)  # spec.output layout
            if cfg.position == "rpe*":
                out = out + static_relative(spec, K.laid_out(spec.kernel), domain,
                                            self.rel_key, self.rel_value)
            out = rearrange(out, self._out_pattern[i])  # (B, Q[, n], width)
            if slot.out_scale != 1.0 and not self.scales_in_weights(out.device):
                out = out * slot.out_scale
            outs[spec.typing.output].append(out)
        return outs

    def updates(self, outs: dict[str, list[torch.Tensor]], domain: Domain
                ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """The unary outputs concatenated (B, Q, M1) and the binary stream's update through its
        fused output projection (B, Q, n, D2), each None when no operator writes there."""
        mixed_u = torch.cat(outs["U"], -1) if outs["U"] else None
        in_weights = mixed_u is not None and self.scales_in_weights(mixed_u.device)
        if in_weights and self.out_scaled["U"]:  # (B, Q, M1): a small stream
            mixed_u = mixed_u * self.output_scales("U", mixed_u)
        if not outs["B"]:
            return mixed_u, None
        cat = torch.cat(outs["B"], -1)  # (B, Q, n, M2)
        weight, bias = adapters.weight(self.out_b), adapters.bias(self.out_b)
        if self.out_scaled["B"] and self.scales_in_weights(cat.device):
            weight = weight * self.output_scales("B", weight)  # (D2, M2): per column
        # the CPU fast product (`folnet.ops.primitives.linear`) on the bidirectional square;
        # causal layers keep the plain product their checkpoints' outputs were made with
        # (the two round differently: ~1e-7 relative)
        return mixed_u, (linear(cat, weight, bias) if domain.visible is None
                         else F.linear(cat, weight, bias))

    @staticmethod
    def scales_in_weights(device: torch.device) -> bool:
        """Whether the operators' constant output scales go through the output projection's
        weight columns (one operation on a small matrix: on CUDA, where each operation is a
        launch) or onto each output (on a CPU: the arithmetic its checkpoints' outputs and
        the demo's figures were made with -- the two round differently, ~1e-7)."""
        return kernel_device(device) != "cpu"

    def output_scales(self, stream: str, like: torch.Tensor) -> torch.Tensor:
        """(M,) each operator output channel's constant scale (`OperatorSlot.out_scale`), in
        ``stream``'s concatenated outputs, on ``like``'s device and dtype: kept once made (not
        while torch.compile traces)."""
        scales = [s.out_scale for s in self.slots if s.spec.typing.output == stream
                  for _ in range(s.out_width)]
        if traced():
            return torch.tensor(scales, dtype=like.dtype, device=like.device)
        key = (stream, like.device, like.dtype)
        cache = self.__dict__.setdefault("_scale_cache", {})
        if key not in cache:
            cache[key] = torch.tensor(scales, dtype=like.dtype, device=like.device)
        return cache[key]
