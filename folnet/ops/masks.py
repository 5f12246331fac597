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
positions see the whole prefix.

A padding mask (``(B, T)`` booleans, True for real tokens) removes pad tokens from every
reduction over tokens. Masked kernel entries are filled with the dtype's most negative finite
value before a softmax (never ``-inf``: a fully masked row then comes out uniform, not NaN) and
with zero otherwise; masked premise entries are zero.
"""

from __future__ import annotations

import functools

import torch

from folnet.ops.spec import TOKEN_LETTERS, OperatorSpec


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


@functools.lru_cache(maxsize=256)
def tril(n: int, device: torch.device) -> torch.Tensor:
    """The plain causal visibility: ``(T, T)`` keep[row, col] = col <= row."""
    return torch.ones(n, n, dtype=torch.bool, device=device).tril_()


def prefix_visibility(prefix_lengths: torch.Tensor, n: int) -> torch.Tensor:
    """PrefixLM visibility ``(B, T, T)``: causal, plus every prefix position sees the whole
    prefix (``prefix_lengths`` (B,) long)."""
    pos = torch.arange(n, device=prefix_lengths.device)
    causal = pos[None, :] <= pos[:, None]  # (T, T)
    in_prefix = pos[None, :] < prefix_lengths[:, None]  # (B, T)
    both = in_prefix[:, :, None] & in_prefix[:, None, :]  # (B, T, T)
    return causal[None] | both


def pair_keep(idx: tuple[str, ...], row: str, col: str, order: torch.Tensor) -> torch.Tensor:
    """A bool tensor broadcastable to a batch-first tensor laid out as ``idx`` that keeps the
    pairs (row, col) that ``order`` ((T, T) or (B, T, T), keep[row, col]) allows."""
    keep = order if order.ndim == 3 else order.unsqueeze(0)  # (B|1, T, T)
    i, j = idx.index(row), idx.index(col)
    if i > j:
        keep = keep.transpose(1, 2)
        i, j = j, i
    shape = [keep.shape[0]] + [1] * len(idx)
    shape[1 + i] = keep.shape[1]
    shape[1 + j] = keep.shape[2]
    return keep.reshape(shape)


def kernel_keep(
    spec: OperatorSpec,
    kidx: tuple[str, ...],
    *,
    order: torch.Tensor | None,
    pad: torch.Tensor | None,
) -> torch.Tensor | None:
    """Which kernel entries (laid out as ``kidx``) take part in the reduction, or None for all.

    ``order`` is the causal visibility (None when not causal); ``pad`` the padding mask."""
    keep = None
    if order is not None and reduces_over_tokens(spec):
        keep = pair_keep(kidx, query_letter(spec), spec.rdim, order)
    if order is not None and "kernel" in spec.mask:
        toks = [c for c in spec.kernel if c in TOKEN_LETTERS]
        k2 = pair_keep(kidx, toks[0], toks[1], order)
        keep = k2 if keep is None else keep & k2
    if pad is not None and reduces_over_tokens(spec):
        shape = [1] * (len(kidx) + 1)
        shape[0] = pad.shape[0]
        shape[1 + kidx.index(spec.rdim)] = pad.shape[1]
        p = pad.reshape(shape)
        keep = p if keep is None else keep & p
    return keep


def premise_keep(spec: OperatorSpec, *, order: torch.Tensor | None) -> torch.Tensor | None:
    if order is None or "premise" not in spec.mask:
        return None
    toks = [c for c in spec.premise if c in TOKEN_LETTERS]
    return pair_keep(spec.premise, toks[0], toks[1], order)


def fill_value(dtype: torch.dtype) -> float:
    return torch.finfo(dtype).min
