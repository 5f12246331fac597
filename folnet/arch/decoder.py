"""The causal dual-branch layer of decoder-only and encoder-decoder FOLNets (paper Appendix A.5).

Three rules make a FOLNet auto-regressive:

1. **Causal reductions.** Every operator is compiled with ``causal=True`` and given the model's
   *visibility* matrix ``visible`` (keep[row, col]; plain causal order, or a PrefixLM's pattern):
   each reduction over tokens feeding position x keeps only visible positions, softmax
   normalisation included, and the binary kernels and premises the spec's ``mask`` names (paper
   Table 5) keep only visible pairs.
2. **Lower-triangular binary atoms.** After the embedding and after every residual update the
   binary stream is multiplied by ``visible``, so u(x_t, x_tau) = 0 whenever t cannot see tau.
   That also makes the binary FFN's transposed input u2(y, x) safe: it is zero unless y sees x.
3. **Decoder form of an operator** (`decoder_spec`). A binary kernel or premise whose *column*
   letter is the query letter (the output token the reduction is bounded by) is read transposed,
   with the query as its row. Only the released ``c`` is affected: its premise ``v_s(a, x)``
   reduces over the binary stream's first index, and under rules 1-2 it would keep a == x only.
   The decoder reads it as the paper writes it, ``v_s(x, a)`` with a <= x -- same parameters,
   the relation seen from the other end.

Besides the full square forward (`forward_square`, the compiled causal operators as they are),
a layer can compute only some *query rows* of a longer token domain (`forward_rows`): the
encoder-decoder's target rows after the encoder's input rows, or the one new row of cached
generation. Tensors indexed by the query token come from the rows' own projections; the others
("context" tensors: ``j``'s and ``a``'s unary premises, ``c``'s kernel, ``t``'s premise v(a, y))
are read from buffers covering the whole domain, which the caller assembles (encoder
projections, or the generation cache). `apply_rows` applies the same masks to such rectangular
calls; the compiled operators' causal path needs square inputs.

Key to shapes: B batch, T tokens, Q query rows, n tokens of the domain, D1/D2 stream widths,
N1/N2 fused projection widths, Wu/Wb widths of the context channels kept per position.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from folnet.arch.config import ModelConfig
from folnet.arch.layer import FolnetLayer, _natural, _perm
from folnet.arch.plan import LayerPlan
from folnet.ops import masks
from folnet.ops.compiler import CompiledOperator, compile_operator
from folnet.ops.spec import OperatorSpec, parse_spec, spec_to_dict

#: ``assemble(own_u, own_b) -> (context_u, context_b)``: given the context channels of the
#: query rows ((B, Q, Wu), (B, Q, n, Wb)), the context buffers over the whole domain
#: ((B, n, Wu), (B, n, n, Wb)).
Assemble = Callable[[torch.Tensor | None, torch.Tensor | None],
                    tuple[torch.Tensor | None, torch.Tensor | None]]


@functools.lru_cache(maxsize=256)
def decoder_spec(spec: OperatorSpec) -> OperatorSpec:
    """The operator as a decoder applies it: binary kernels/premises indexed (z, query) are read
    as (query, z), so that lower-triangular binary atoms stay informative (module docstring)."""
    q = masks.query_letter(spec)
    data = spec_to_dict(spec)
    changed = []
    for role in ("kernel", "premise"):
        toks = spec.tokens(role)
        if len(toks) == 2 and toks[1] == q:
            idx = list(spec.tensor(role))
            i, j = idx.index(toks[0]), idx.index(toks[1])
            idx[i], idx[j] = idx[j], idx[i]
            data[role] = " ".join(idx)
            changed.append(role)
    if not changed:
        return spec
    data["remark"] = (f"decoder form: {' and '.join(changed)} read with the query token "
                      f"{q!r} as row (causal binary atoms are lower-triangular)")
    return parse_spec(data)


@dataclass(frozen=True)
class View:
    """Where a kernel or premise sits in the channels of the buffer it is read from."""

    start: int
    width: int
    channels: tuple[int, ...]

    def take(self, buf: torch.Tensor, idx: tuple[str, ...]) -> torch.Tensor:
        """Its channels of ``buf`` (tokens first, channels last) laid out as ``idx``."""
        x = buf[..., self.start : self.start + self.width].unflatten(-1, self.channels)
        perm = _perm(_natural(idx), idx)
        return x if perm is None else x.permute(perm)


def _pad_keep(pad: torch.Tensor, idx: tuple[str, ...], letter: str) -> torch.Tensor:
    shape = [1] * (len(idx) + 1)
    shape[0], shape[1 + idx.index(letter)] = pad.shape[0], pad.shape[1]
    return pad.reshape(shape)


def apply_rows(op: CompiledOperator, kernel: torch.Tensor, premise: torch.Tensor, *,
               rows: torch.Tensor, visible: torch.Tensor, pad: torch.Tensor | None = None,
               dropout_p: float = 0.0, premasked: frozenset[str] = frozenset()) -> torch.Tensor:
    """A causal operator evaluated at query rows only.

    ``op`` is the *non-causal* compile of the spec; the query letter's axis has ``len(rows)``
    entries at domain positions ``rows`` (Q,), every other token axis spans the whole domain of
    n tokens; ``visible`` (B|1, n, n) and ``pad`` (B, n) are over the domain. The masks are the
    ones `folnet.ops.masks` defines for the causal compile, so with ``rows = arange(n)`` this
    equals ``compile_operator(spec, causal=True)(kernel, premise, pad, visible=visible)``.
    ``premasked`` names tensors ("kernel", "premise") already multiplied by their Table 5 mask
    (never a softmax kernel, whose masked entries must be -inf-like, not zero): re-masking the
    cached O(n^2) premise of ``t`` at every generation step would cost more than ``t`` itself.
    """
    spec = op.spec
    q = masks.query_letter(spec)

    def order(row: str, col: str) -> torch.Tensor:  # (B|1, Q|n, Q|n) keep[row, col]
        vis = visible.index_select(1, rows) if row == q else visible
        return vis.index_select(2, rows) if col == q else vis

    kidx = spec.kernel
    keep = None
    if masks.reduces_over_tokens(spec):
        if q not in kidx:  # per-query normalisation needs the kernel per query row
            kidx = (q, *kidx)
            kernel = kernel.unsqueeze(1).expand(kernel.shape[0], rows.numel(), *kernel.shape[1:])
        keep = masks.pair_keep(kidx, q, spec.rdim, order(q, spec.rdim))
        if pad is not None:
            keep = keep & _pad_keep(pad, kidx, spec.rdim)
    if "kernel" in spec.mask and "kernel" not in premasked:
        r, c = spec.tokens("kernel")
        k2 = masks.pair_keep(kidx, r, c, order(r, c))
        keep = k2 if keep is None else keep & k2
    if keep is not None:
        kernel = (kernel.masked_fill(~keep, masks.fill_value(kernel.dtype))
                  if spec.activation == "softmax" else kernel * keep)
    if "premise" in spec.mask and "premise" not in premasked:
        r, c = spec.tokens("premise")
        premise = premise * masks.pair_keep(spec.premise, r, c, order(r, c))
    if kidx == spec.kernel:
        return op(kernel, premise, dropout_p=dropout_p)
    if spec.activation == "softmax":
        kernel = torch.softmax(kernel, dim=1 + kidx.index(spec.rdim))
    if dropout_p > 0.0:
        kernel = F.dropout(kernel, p=dropout_p, training=True)
    k, p, o = ("".join(t) for t in (kidx, spec.premise, spec.output))
    return torch.einsum(f"b{k},b{p}->b{o}", kernel, premise)


class DecoderLayer(FolnetLayer):
    """A `FolnetLayer` (same parameters, same state-dict keys) applied causally. It uses the
    layer's projections, output and FFN modules, with its own operator loop.

    With ``cross=True`` (the encoder-decoder's decoder) it also owns ``cross_u`` / ``cross_b``,
    Linear projections of the encoder's final unary / binary atoms onto the context channels:
    the encoder rows of ``j``'s and ``a``'s premises and ``c``'s kernel (paper A.5: "a
    concatenation of the unary atoms from the encoder output (with a linear projection) and the
    decoder premises"), and ``t``'s premise v^E(a, y) for input positions a, y.
    """

    def __init__(self, plan: LayerPlan, cfg: ModelConfig, *, cross: bool = False):
        super().__init__(plan, cfg, causal=True)
        self.specs = [decoder_spec(slot.spec) for slot in self.slots]
        self.causal_ops = [compile_operator(s, cfg.backend, causal=True) for s in self.specs]
        self.row_ops = [compile_operator(s, cfg.backend) for s in self.specs]
        index: dict[str, list[int]] = {"U": [], "B": []}
        # per slot and role: (stream, view in the fused projection, view in the context buffer
        # or None when the tensor is indexed by the query row)
        self.sources: list[dict[str, tuple[str, View, View | None]]] = []
        # binary context tensors come from buffers already multiplied by the visibility
        self.premasked: list[frozenset[str]] = []
        for slot, spec in zip(self.slots, self.specs, strict=True):
            q = masks.query_letter(spec)
            entry = {}
            for role in ("kernel", "premise"):
                seg = getattr(slot, role)
                own = View(seg.start, seg.width, seg.channels)
                ctx = None
                if spec.tokens(role)[0] != q:  # indexed by other positions: context channels
                    idx = index[seg.stream]
                    ctx = View(len(idx), seg.width, seg.channels)
                    idx.extend(range(seg.start, seg.start + seg.width))
                entry[role] = (seg.stream, own, ctx)
            self.sources.append(entry)
            self.premasked.append(frozenset(
                role for role, (stream, _, ctx) in entry.items()
                if stream == "B" and ctx is not None
                and (role == "premise" or spec.activation != "softmax")))
        self.width_u, self.width_b = len(index["U"]), len(index["B"])
        self.register_buffer("ctx_index_u", torch.tensor(index["U"], dtype=torch.long),
                             persistent=False)
        self.register_buffer("ctx_index_b", torch.tensor(index["B"], dtype=torch.long),
                             persistent=False)
        self.cross = cross
        self.cross_u = nn.Linear(cfg.D1, self.width_u) if cross and self.width_u else None
        self.cross_b = nn.Linear(cfg.D2, self.width_b) if cross and self.width_b else None

    # -- shared pieces ---------------------------------------------------------------------------
    def _project(self, u1, u2):
        n1 = F.layer_norm(u1, (self.cfg.D1,), eps=self.cfg.layer_norm_eps)
        n2 = F.layer_norm(u2, (self.cfg.D2,), eps=self.cfg.layer_norm_eps)
        return {"U": self.proj_u(n1) if self.proj_u is not None else None,  # (B, Q, N1)
                "B": self.proj_b(n2) if self.proj_b is not None else None}  # (B, Q, n, N2)

    def context_channels(self, proj: dict, keep2: torch.Tensor
                         ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """The context channels of projected rows: ``(B, Q, Wu)`` and ``(B, Q, n, Wb)``, the
        binary ones multiplied by the rows' visibility ``keep2`` (B|1, Q, n, 1)."""
        cu = proj["U"].index_select(-1, self.ctx_index_u) if self.width_u else None
        cb = proj["B"].index_select(-1, self.ctx_index_b) * keep2 if self.width_b else None
        return cu, cb

    def cross_context(self, enc_u: torch.Tensor, enc_b: torch.Tensor
                      ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """Encoder atoms (B, N, D1), (B, N, N, D2) -> context rows (B, N, Wu), (B, N, N, Wb)
        (every input pair is visible: nothing to mask)."""
        cu = self.cross_u(enc_u) if self.cross_u is not None else None
        cb = self.cross_b(enc_b) if self.cross_b is not None else None
        return cu, cb

    def _operands(self, i, proj, ctx=None):
        """Kernel and premise of slot i: from the rows' projections, or from the context
        buffers (``ctx``) for tensors not indexed by the query row (None: square forward)."""
        spec = self.specs[i]
        pair = []
        for role in ("kernel", "premise"):
            stream, own, in_ctx = self.sources[i][role]
            if ctx is None or in_ctx is None:
                pair.append(own.take(proj[stream], spec.tensor(role)))
            else:
                pair.append(in_ctx.take(ctx[stream], spec.tensor(role)))
        K, v = pair
        if self.slots[i].kernel_scale != 1.0:
            K = K * self.slots[i].kernel_scale
        return K, v

    def _collect(self, i, out, outs):
        spec, slot = self.specs[i], self.slots[i]
        perm = _perm(spec.output, _natural(spec.output))
        out = (out if perm is None else out.permute(perm)).flatten(
            -len(spec.channels("output")))  # (B, Q[, n], width)
        if slot.out_scale != 1.0:
            out = out * slot.out_scale
        outs[spec.typing.output].append(out)

    def _residual(self, u1, u2, outs, keep2):
        if outs["U"]:
            u1 = u1 + self.dropout(self.out_u(torch.cat(outs["U"], -1)))  # (B, Q, D1)
        if outs["B"]:
            u2 = (u2 + self.dropout(self.out_b(torch.cat(outs["B"], -1)))) * keep2
        return u1, u2

    def _ffn(self, u1, u2, n2, n2t, keep2):
        """The Boolean stage on normalised ``n2`` and its transposed input ``n2t`` u2(y, x)."""
        eps = self.cfg.layer_norm_eps
        u1 = u1 + self.dropout(self.ffn_u(F.layer_norm(u1, (self.cfg.D1,), eps=eps)))
        hidden = F.gelu(self.ffn_b.inp(torch.cat([n2, n2t], dim=-1)))  # (B, Q, n, F2)
        u2 = (u2 + self.dropout(self.ffn_b.out(hidden) + self.ffn_b.skip(n2t))) * keep2
        return u1, u2

    def _p(self, spec: OperatorSpec) -> float:
        return self.cfg.kernel_dropout if self.training and spec.kernel_dropout else 0.0

    # -- the two forwards ----------------------------------------------------------------------
    def forward_square(self, u1: torch.Tensor, u2: torch.Tensor, visible: torch.Tensor,
                       pad: torch.Tensor | None = None, *, collect: bool = False
                       ) -> tuple[torch.Tensor, torch.Tensor, tuple | None]:
        """Every position of a sequence: u1 (B, T, D1), u2 (B, T, T, D2), visible (B|1, T, T).

        Returns (u1, u2, context) where context is the rows' context channels when ``collect``
        (what a generation cache keeps), else None."""
        proj = self._project(u1, u2)
        outs: dict[str, list[torch.Tensor]] = {"U": [], "B": []}
        for i, op in enumerate(self.causal_ops):
            K, v = self._operands(i, proj)
            self._collect(i, op(K, v, pad, dropout_p=self._p(op.spec), visible=visible), outs)
        keep2 = visible.unsqueeze(-1)  # (B|1, T, T, 1)
        ctx = self.context_channels(proj, keep2) if collect else None
        u1, u2 = self._residual(u1, u2, outs, keep2)
        n2 = F.layer_norm(u2, (self.cfg.D2,), eps=self.cfg.layer_norm_eps)
        # the transposed input is zero wherever y does not see x: u2 is masked, LN(0) = 0
        u1, u2 = self._ffn(u1, u2, n2, n2.transpose(1, 2), keep2)  # n2t (B, T, T, D2)
        return u1, u2, ctx

    def forward_rows(self, u1: torch.Tensor, u2: torch.Tensor, assemble: Assemble,
                     rows: torch.Tensor, visible: torch.Tensor,
                     pad: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Query rows of a longer domain: u1 (B, Q, D1), u2 (B, Q, n, D2) at domain positions
        ``rows`` (Q,); ``visible`` (B|1, n, n), ``pad`` (B, n) over the domain.

        ``assemble`` turns the rows' context channels into the context buffers of the whole
        domain (`Assemble`). The domain's other rows must precede the query rows and never
        see them (encoder rows; already generated rows), so the FFN's transposed input
        u2(y, x) comes from the query rows alone."""
        proj = self._project(u1, u2)
        vis_rows = visible.index_select(1, rows)  # (B|1, Q, n)
        keep2 = vis_rows.unsqueeze(-1)
        own_u, own_b = self.context_channels(proj, keep2)
        ctx = dict(zip("UB", assemble(own_u, own_b), strict=True))
        outs: dict[str, list[torch.Tensor]] = {"U": [], "B": []}
        for i, op in enumerate(self.row_ops):
            K, v = self._operands(i, proj, ctx)
            self._collect(i, apply_rows(op, K, v, rows=rows, visible=visible, pad=pad,
                                        dropout_p=self._p(op.spec),
                                        premasked=self.premasked[i]), outs)
        u1, u2 = self._residual(u1, u2, outs, keep2)
        n2 = F.layer_norm(u2, (self.cfg.D2,), eps=self.cfg.layer_norm_eps)
        block = n2.index_select(2, rows).transpose(1, 2)  # (B, Q, Q, D2) u2(y, x), y, x rows
        block = block * vis_rows.index_select(2, rows).transpose(1, 2).unsqueeze(-1)
        n2t = torch.zeros_like(n2).index_copy(2, rows, block)  # (B, Q, n, D2)
        return self._ffn(u1, u2, n2, n2t, keep2)
