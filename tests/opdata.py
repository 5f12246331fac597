"""Random, non-zero inputs laid out as an operator spec says (shared by the operator tests)."""

from __future__ import annotations

import torch

from folnet.ops.spec import TOKEN_LETTERS, OperatorSpec

SIZES = {"x": 5, "y": 5, "a": 5, "h": 2, "s": 3, "w": 4}


def shape(spec: OperatorSpec, role: str, batch: int = 2, sizes=SIZES) -> tuple[int, ...]:
    return (batch, *(sizes[c] for c in spec.tensor(role)))


def inputs(spec: OperatorSpec, *, dtype=torch.float64, seed=0, batch=2, sizes=SIZES,
           requires_grad=False):
    g = torch.Generator().manual_seed(seed)
    k = torch.randn(shape(spec, "kernel", batch, sizes), generator=g, dtype=torch.float64)
    v = torch.randn(shape(spec, "premise", batch, sizes), generator=g, dtype=torch.float64)
    k, v = k.to(dtype), v.to(dtype)
    return k.requires_grad_(requires_grad), v.requires_grad_(requires_grad)


def perturb_after(t: torch.Tensor, idx: tuple[str, ...], pos: int, seed: int) -> torch.Tensor:
    """A copy of ``t`` (batch-first, laid out as ``idx``) with fresh random values wherever any
    token index is > ``pos``."""
    out = t.detach().clone()
    noise = torch.randn(t.shape, generator=torch.Generator().manual_seed(seed), dtype=t.dtype)
    where = torch.zeros(t.shape, dtype=torch.bool)
    for i, c in enumerate(idx):
        if c in TOKEN_LETTERS:
            sl = [slice(None)] * t.ndim
            sl[1 + i] = slice(pos + 1, None)
            where[tuple(sl)] = True
    out[where] = noise[where] * 3.0
    return out


def perturb_tokens(t: torch.Tensor, idx: tuple[str, ...], bad: torch.Tensor, seed: int):
    """Fresh random values wherever any token index of ``t`` is a position flagged in
    ``bad`` (B, T) bool."""
    out = t.detach().clone()
    noise = torch.randn(t.shape, generator=torch.Generator().manual_seed(seed), dtype=t.dtype)
    where = torch.zeros(t.shape, dtype=torch.bool)
    for i, c in enumerate(idx):
        if c in TOKEN_LETTERS:
            shp = [1] * t.ndim
            shp[0], shp[1 + i] = bad.shape[0], bad.shape[1]
            where = where | bad.reshape(shp)
    out[where] = noise[where] * 3.0
    return out


def leading(t: torch.Tensor, idx: tuple[str, ...], pos: int) -> torch.Tensor:
    """The entries of ``t`` whose token indices are all <= ``pos``."""
    sl = [slice(None)] * t.ndim
    for i, c in enumerate(idx):
        if c in TOKEN_LETTERS:
            sl[1 + i] = slice(0, pos + 1)
    return t[tuple(sl)]
