"""The row-blocked binary FFN: equal to the full-square stage in value and in every gradient,
whatever the block size, and refusing what it cannot compute."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from tolerances import assert_close, assert_rel

from folnet.errors import FolnetError
from folnet.ops.primitives import binary_ffn

pytestmark = pytest.mark.numerics


def _reference(n, w_in, b_in, w_out, b_out, w_skip, b_skip):
    """The stage written out over the full square, pair by pair through einsum (float64)."""
    nt = n.transpose(1, 2)
    hidden = F.gelu(torch.einsum("bxyc,fc->bxyf", torch.cat([n, nt], -1), w_in) + b_in)
    return (torch.einsum("bxyf,df->bxyd", hidden, w_out) + b_out
            + torch.einsum("bxyc,dc->bxyd", nt, w_skip) + b_skip)


def _inputs(b=2, t=11, d2=6, f2=20, seed=0):
    g = torch.Generator().manual_seed(seed)
    shapes = [(b, t, t, d2), (f2, 2 * d2), (f2,), (d2, f2), (d2,), (d2, d2), (d2,)]
    return [torch.randn(s, generator=g, dtype=torch.float64).requires_grad_() for s in shapes]


@pytest.mark.parametrize("rows", [1, 3, 4, 11, 64])
def test_value_and_every_gradient_match_the_full_square(rows):
    args = _inputs()
    weight = torch.randn(args[0].shape, dtype=torch.float64)  # a random upstream gradient
    want = _reference(*args)
    grads_want = torch.autograd.grad((want * weight).sum(), args)
    got = binary_ffn(*args, rows=rows)
    grads_got = torch.autograd.grad((got * weight).sum(), args)
    assert_close(got, want, rtol=1e-12, atol=1e-12, what=f"output, {rows} rows")
    for name, a, b in zip(("n", "w_in", "b_in", "w_out", "b_out", "w_skip", "b_skip"),
                          grads_got, grads_want, strict=True):
        assert_close(a, b, rtol=1e-10, atol=1e-10, what=f"gradient of {name}, {rows} rows")


@pytest.mark.parametrize("rows", [1, 4, 11])
def test_dropout_inside_the_blocks_is_the_masked_full_square(rows):
    """With a keep mask the output is ``ffn * keep / (1 - p)`` and so is every gradient's
    upstream (the mask read by each block in both passes)."""
    args = _inputs(seed=2)
    p = 0.3
    keep = torch.rand(args[0].shape, generator=torch.Generator().manual_seed(9)) >= p
    assert 0 < keep.sum() < keep.numel()
    weight = torch.randn(args[0].shape, dtype=torch.float64)
    want = _reference(*args) * keep / (1 - p)
    got = binary_ffn(*args, rows=rows, keep=keep, p=p)
    assert_close(got, want, rtol=1e-12, atol=1e-12, what=f"dropped output, {rows} rows")
    for a, b in zip(torch.autograd.grad((got * weight).sum(), args),
                    torch.autograd.grad((want * weight).sum(), args), strict=True):
        assert_close(a, b, rtol=1e-10, atol=1e-10, what=f"dropped gradient, {rows} rows")


def test_float32_within_1e_5_relative():
    args = [a.detach().float().requires_grad_() for a in _inputs(t=33, seed=1)]
    full = _reference(*args)
    blocked = binary_ffn(*args, rows=8)
    assert_rel(blocked, full, 1e-5, "float32 output")
    g_full = torch.autograd.grad(full.square().sum(), args)
    g_blocked = torch.autograd.grad(blocked.square().sum(), args)
    for name, a, b in zip(("n", "w_in", "b_in", "w_out", "b_out", "w_skip", "b_skip"),
                          g_blocked, g_full, strict=True):
        assert_rel(a, b, 1e-5, f"float32 gradient of {name}")


@pytest.mark.parametrize("rows", [0, -2, 2.5, True])
def test_bad_block_sizes(rows):
    with pytest.raises(FolnetError, match="block rows must be a positive integer"):
        binary_ffn(*_inputs(t=4), rows=rows)


def test_only_a_full_square():
    args = _inputs(t=4)
    args[0] = torch.randn(2, 3, 4, 6, dtype=torch.float64)
    with pytest.raises(FolnetError, match=r"full square \(B, T, T, D2\), got \(2, 3, 4, 6\)"):
        binary_ffn(*args, rows=2)


@pytest.mark.parametrize("rows", [1, 4, 11])
def test_normalising_blocks_are_the_stage_of_the_normalised_square(rows):
    """``eps`` given: the input is the stream before its LayerNorm, which each block applies to
    its own slabs; value and every gradient (the stream's through the LayerNorm) are those of
    the reference over ``F.layer_norm`` of the whole square, with dropout inside."""
    args = _inputs(seed=3)
    u2 = (args[0].detach() * 3 + 1).requires_grad_()  # off zero mean and unit variance
    args[0] = u2
    p, eps = 0.25, 1e-5
    keep = torch.rand(u2.shape, generator=torch.Generator().manual_seed(4)) >= p
    weight = torch.randn(u2.shape, dtype=torch.float64)
    want = _reference(F.layer_norm(u2, (u2.shape[-1],), eps=eps), *args[1:]) * keep / (1 - p)
    got = binary_ffn(*args, rows=rows, keep=keep, p=p, eps=eps)
    assert_close(got, want, rtol=1e-12, atol=1e-12, what=f"normalised output, {rows} rows")
    for name, a, b in zip(("u2", "w_in", "b_in", "w_out", "b_out", "w_skip", "b_skip"),
                          torch.autograd.grad((got * weight).sum(), args),
                          torch.autograd.grad((want * weight).sum(), args), strict=True):
        assert b.abs().max() > 0
        assert_close(a, b, rtol=1e-10, atol=1e-10, what=f"gradient of {name}, {rows} rows")


def test_normalising_blocks_keep_the_forward_bits_of_the_normalised_square():
    """float32: the blocks' LayerNorm of each slab is the whole square's LayerNorm, bit for
    bit (it is per pair), so the output equals the blocked stage over the normalised square
    exactly; the gradients differ only by summation order."""
    args = [a.detach().float().requires_grad_() for a in _inputs(t=33, seed=5)]
    eps = 1e-12
    normalised = F.layer_norm(args[0], (args[0].shape[-1],), torch.ones(6), torch.zeros(6), eps)
    want = binary_ffn(normalised, *args[1:], rows=8)
    got = binary_ffn(*args, rows=8, eps=eps)
    assert torch.equal(got, want)
    g_want = torch.autograd.grad(want.square().sum(), args)
    g_got = torch.autograd.grad(got.square().sum(), args)
    for name, a, b in zip(("u2", "w_in", "b_in", "w_out", "b_out", "w_skip", "b_skip"),
                          g_got, g_want, strict=True):
        assert_rel(a, b, 1e-5, f"float32 gradient of {name}")


def test_normalising_blocks_under_autocast_normalise_before_the_cast():
    """Under CPU autocast the stream is normalised in its own dtype, then cast (as the layer
    did with a normalised square: LayerNorm runs in float32 under autocast); the stream's
    gradient comes back in its dtype."""
    args = [a.detach().float().requires_grad_() for a in _inputs(t=9, seed=6)]
    eps = 1e-5
    with torch.autocast("cpu", dtype=torch.bfloat16):
        want = binary_ffn(F.layer_norm(args[0], (6,), eps=eps), *args[1:], rows=4)
        got = binary_ffn(*args, rows=4, eps=eps)
    assert got.dtype == want.dtype == torch.bfloat16
    assert torch.equal(got, want)
    grads = torch.autograd.grad(got.float().square().sum(), args)
    assert grads[0].dtype == torch.float32
    ref = torch.autograd.grad(want.float().square().sum(), args)
    assert_rel(grads[0], ref[0], 2e-2, "bfloat16 gradient of u2")


def test_normalising_needs_blocks():
    with pytest.raises(FolnetError, match=r"only in blocks of rows; got rows=None with eps"):
        binary_ffn(*_inputs(t=4), eps=1e-5)
