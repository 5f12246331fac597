"""Causal and padding masks for compiled operators.

Causal mode (decoders, paper Appendix A.5 and Table 5) means two things:

1. every reduction over the token R-dim ``a`` feeding an output at token position ``q`` (the
   output's first token letter) keeps only ``a <= q`` -- softmax normalisation included, so the
   future cannot leak through a denominator. When the kernel has no ``q`` index (``c``'s
   ``K_sh(a)``), the kernel is broadcast over ``q`` first (see `expanded_kernel`);
2. every tensor the spec's ``mask`` names keeps only the pairs (row, column) with
   column <= row, which makes the binary atoms lower-triangular as in the paper.

"<=" is the *visibility* relation: plain causal order by default (`tril`), or any
``(B, T, T)`` keep[row, col] matrix -- a PrefixLM's (`prefix_visibility`) lets prefix
positions see the whole prefix. A call may also cover only some *query rows* of a longer
domain (the new row of cached generation, a decoder's targets after the encoder's inputs):
`Visibility` then reads the matrix at those rows along the query letter's axis.

A causal model applies an operator in its `causal_form`: a binary kernel or premise whose
*column* is the query letter is read transposed, so that lower-triangular binary atoms keep
their information (only the released ``c`` is affected).

A padding mask (``(B, T)`` booleans, True for real tokens) removes pad tokens from every
reduction over tokens. Masked kernel entries are filled with the dtype's most negative finite
value before a softmax (never ``-inf``: a fully masked row then comes out uniform, not NaN) and
with zero otherwise; masked premise entries are zero.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
from einops import rearrange

from folnet.ops.spec import ROLES, TOKEN_LETTERS, OperatorSpec, parse_spec, spec_to_dict
from folnet.tracing import traced


def query_letter(spec: OperatorSpec) -> str:
    """The output token a causal reduction is bounded by: the output's first token letter."""
    return next(c for c in spec.output if c in TOKEN_LETTERS)


def reduces_over_tokens(spec: OperatorSpec) -> bool:
    return spec.rdim in TOKEN_LETTERS


def expanded_kernel(spec: OperatorSpec, causal: bool) -> tuple[str, ...]:
    """The kernel index list the contraction uses: with the query letter prepended when causal
    normalisation needs it and the kernel lacks it."""
    if causal and reduces_over_tokens(spec):
        q = query_letter(spec)
        if q not in spec.kernel:
            return (q, *spec.kernel)
    return spec.kernel


def tril(n: int, device: torch.device) -> torch.Tensor:
    """The plain causal visibility: ``(T, T)`` keep[row, col] = col <= row. Cached per
    (length, device) in eager mode; made afresh while torch.export or torch.compile traces
    (a symbolic length cannot be a cache key, and a cached tensor made during one trace is
    a fake tensor that the next trace would take for a constant)."""
    if not isinstance(n, int) or traced():
        return torch.ones(n, n, dtype=torch.bool, device=device).tril_()
    return _tril(n, device)


@functools.lru_cache(maxsize=256)
def _tril(n: int, device: torch.device) -> torch.Tensor:
    return torch.ones(n, n, dtype=torch.bool, device=device).tril_()


def prefix_visibility(prefix_lengths: torch.Tensor, n: int,
                      positions: torch.Tensor | None = None) -> torch.Tensor:
    """PrefixLM visibility ``(B, T, T)``: causal, plus every prefix position sees the whole
    prefix (``prefix_lengths`` (B,) long). ``positions`` ((B|1, T), default 0..T-1) count the
    prefix from each row's first real token, so a left-padded row keeps its prefix."""
    pos = torch.arange(n, device=prefix_lengths.device)
    causal = pos[None, :] <= pos[:, None]  # (T, T)
    at = pos[None] if positions is None else positions  # (B|1, T)
    in_prefix = at < prefix_lengths[:, None]  # (B, T)
    both = in_prefix[:, :, None] & in_prefix[:, None, :]  # (B, T, T)
    return causal[None] | both


@dataclass(frozen=True, eq=False)
class Visibility:
    """keep[row, col] of a causal domain as one operator call sees it: the ``query`` letter's
    axis holds the domain positions ``rows`` (every position when None), every other token
    axis the whole domain."""

    matrix: torch.Tensor  # (B|1, n, n) bool
    query: str
    rows: torch.Tensor | None = None  # (Q,) long

    def pair(self, row: str, col: str) -> torch.Tensor:
        """keep[row, col] for the token axes ``row`` and ``col``: (B|1, R, C)."""
        vis = self.matrix
        if self.rows is not None:
            if row == self.query:
                vis = vis.index_select(1, self.rows)
            if col == self.query:
                vis = vis.index_select(2, self.rows)
        return vis


def pair_keep(idx: tuple[str, ...], row: str, col: str, keep: torch.Tensor) -> torch.Tensor:
    """A bool tensor broadcastable to a batch-first tensor laid out as ``idx`` that keeps the
    pairs (row, col) that ``keep`` ((B|1, R, C), keep[row, col]) allows."""
    # (B|1, R, C) -> (B|1, ...) with R and C at their letters' places, 1 at every other
    return rearrange(keep, f"batch {row} {col} -> batch "
                     + " ".join(c if c in (row, col) else "1" for c in idx))


def kernel_keep(spec: OperatorSpec, kidx: tuple[str, ...], *, order: Visibility | None,
                pad: torch.Tensor | None, premasked: bool = False) -> torch.Tensor | None:
    """Which kernel entries (laid out as ``kidx``) take part in the reduction, or None for all.

    ``order`` is the causal visibility (None when not causal); ``pad`` (B, n) the padding mask
    of the domain; ``premasked``: the kernel already carries its Table 5 mask."""
    keep = None
    if order is not None and reduces_over_tokens(spec):
        q = query_letter(spec)
        keep = pair_keep(kidx, q, spec.rdim, order.pair(q, spec.rdim))
    if order is not None and "kernel" in spec.mask and not premasked:
        row, col = spec.tokens("kernel")
        k2 = pair_keep(kidx, row, col, order.pair(row, col))
        keep = k2 if keep is None else keep & k2
    if pad is not None and reduces_over_tokens(spec):
        # (B, n) -> (B, ...) with n at the reduced letter's place
        p = rearrange(pad, f"batch {spec.rdim} -> batch "
                      + " ".join(c if c == spec.rdim else "1" for c in kidx))
        keep = p if keep is None else keep & p
    return keep


def premise_keep(spec: OperatorSpec, pidx: tuple[str, ...], *, order: Visibility | None,
                 premasked: bool = False) -> torch.Tensor | None:
    """The Table 5 mask of a premise laid out as ``pidx``, or None."""
    if order is None or "premise" not in spec.mask or premasked:
        return None
    row, col = spec.tokens("premise")
    return pair_keep(pidx, row, col, order.pair(row, col))


@functools.lru_cache(maxsize=256)
def causal_form(spec: OperatorSpec) -> OperatorSpec:
    """The operator as a causal model applies it: binary kernels/premises indexed (z, query) are
    read as (query, z), so that lower-triangular binary atoms stay informative. The released
    ``c`` reduces over the binary stream's first index, v_s(a, x); causally that would keep
    a == x only, so its causal form reads v_s(x, a) with a <= x, as the paper writes it --
    same parameters, the relation seen from the other end."""
    q = query_letter(spec)
    data = spec_to_dict(spec)
    changed = []
    for role in ROLES:
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


def fill_value(dtype: torch.dtype) -> float:
    return torch.finfo(dtype).min
