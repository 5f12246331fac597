"""The hot-path kernels (oneDNN products, segmented projection, binary FFN with recomputation,
cheap dropout) against plain PyTorch, values and gradients, float32 and bf16 autocast."""

from __future__ import annotations

import math
import sys

import pytest
import torch
import torch.nn.functional as F
from tolerances import assert_close
from torch.utils.flop_counter import FlopCounterMode

from folnet.ops import primitives as kernels


def _grads(fn, tensors, seed=0):
    out = fn(*tensors)
    outs = out if isinstance(out, tuple) else (out,)
    g = torch.Generator().manual_seed(seed)
    gouts = [torch.randn(o.shape, generator=g).to(o.dtype) for o in outs]
    grads = torch.autograd.grad(outs, tensors, gouts, allow_unused=True)
    return outs, grads


def _close(a, b, tol):
    for x, y in zip(a, b, strict=True):
        if x is None or y is None:
            assert x is None and y is None
            continue
        x, y = x.detach().float(), y.detach().float()
        assert float((x - y).norm() / y.norm().clamp_min(1e-12)) < tol


def _params(*shapes, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(s, generator=g).requires_grad_() for s in shapes]


def test_linear_matches_f_linear():
    x, w, b = _params((2, 6, 6, 12), (20, 12), (20,))
    got = _grads(kernels.linear, [x, w, b])
    want = _grads(F.linear, [x, w, b])
    _close(got[0], want[0], 1e-6)
    _close(got[1], want[1], 1e-6)


def test_segmented_linear_matches_slices_in_both_layouts():
    x, w, b = _params((2, 5, 5, 8), (30, 8), (30,))
    segments = ((0, 4, "cf"), (4, 10, "cl"), (20, 10, "cf"))  # rows 14..19 unused

    def ref(x, w, b):
        outs = []
        for start, width, layout in segments:
            y = F.linear(x, w[start : start + width], b[start : start + width])
            outs.append(y if layout == "cl" else y.permute(0, 3, 1, 2))
        return tuple(outs)

    got = _grads(lambda *t: kernels.segmented_linear(*t, segments), [x, w, b])
    want = _grads(ref, [x, w, b])
    _close(got[0], want[0], 1e-6)
    _close(got[1], want[1], 1e-6)
    assert got[0][0].shape == (2, 4, 5, 5) and got[0][1].shape == (2, 5, 5, 10)
    assert torch.count_nonzero(got[1][1][14:20]) == 0  # unused rows get no gradient


@pytest.mark.parametrize("consumer", ["as_is", "permuted", "tokens_swapped"])
def test_segmented_linear_takes_gradients_in_any_layout(consumer):
    """A contraction may hand a channels-first segment its gradient laid out channels last
    (or vice versa, or with the token axes swapped); every layout must give the same grads."""
    x, w, b = _params((2, 6, 6, 8), (40, 8), (40,), seed=1)
    segments = ((0, 4, "cf"), (4, 12, "cf"), (16, 8, "cl"), (24, 16, "cf"))
    g = torch.Generator().manual_seed(5)
    weights = [torch.randn(2, 6, 6, width, generator=g) for _, width, _ in segments]

    def consume(outs):  # a scalar whose gradient w.r.t. each output has the chosen layout
        total = 0.0
        for (_, _, layout), y, r in zip(segments, outs, weights, strict=True):
            cl = y if layout == "cl" else y.permute(0, 2, 3, 1)  # (B, T, T, C) view
            if consumer == "permuted":
                cl = cl.contiguous()
            elif consumer == "tokens_swapped":
                cl = cl.transpose(1, 2).contiguous().transpose(1, 2)
            total = total + (cl * r).sum()
        return total

    def ref(x, w, b):
        return tuple(F.linear(x, w[s : s + n], b[s : s + n]) if lay == "cl" else
                     F.linear(x, w[s : s + n], b[s : s + n]).permute(0, 3, 1, 2)
                     for s, n, lay in segments)

    got = torch.autograd.grad(consume(kernels.segmented_linear(x, w, b, segments)), [x, w, b])
    want = torch.autograd.grad(consume(ref(x, w, b)), [x, w, b])
    _close(got, want, 1e-6)


def _plain_ffn(n, w_in, b_in, w_out, b_out, w_skip, b_skip):
    nt = n.transpose(1, 2)
    hidden = F.gelu(F.linear(torch.cat([n, nt], -1), w_in, b_in))
    return F.linear(hidden, w_out, b_out) + F.linear(nt, w_skip, b_skip)


def test_binary_ffn_recomputing_backward_matches():
    params = _params((2, 7, 7, 6), (10, 12), (10,), (6, 10), (6,), (6, 6), (6,))
    got = _grads(kernels.binary_ffn, params)
    want = _grads(_plain_ffn, params)
    _close(got[0], want[0], 1e-6)
    _close(got[1], want[1], 1e-5)


def test_bf16_autocast_paths_follow_autocast():
    x, w, b = _params((2, 6, 6, 16), (8, 16), (8,))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = kernels.linear(x, w, b)
        z = kernels.binary_ffn(*_params((2, 5, 5, 4), (6, 8), (6,), (4, 6), (4,), (4, 4), (4,)))
    assert y.dtype == torch.bfloat16 and z.dtype == torch.bfloat16
    _close([y], [F.linear(x, w, b)], 1e-2)
    y.float().sum().backward()
    assert w.grad is not None and w.grad.dtype == torch.float32


@pytest.mark.numerics
def test_dropout_rate_scale_and_gradient():
    torch.manual_seed(0)
    x = torch.randn(200, 500, requires_grad=True)
    y = kernels.dropout(x, 0.1, True)
    kept = y != 0
    rate = 1 - kept.float().mean().item()
    assert abs(rate - 0.1) < 0.005
    # x * (1 / 0.9) against x / 0.9: one float32 rounding apart (up to 1.2e-7 relative)
    assert_close(y[kept], x[kept] / 0.9, rtol=1e-5, atol=0, what="kept values")
    y.backward(torch.ones_like(y))
    assert_close(x.grad, kept.float() / 0.9, rtol=1e-5, atol=0, what="dropout gradient")
    assert torch.equal(kernels.dropout(x, 0.1, False), x)


@pytest.mark.numerics
def test_dropout_add_and_determinism():
    r = torch.randn(64, 64, requires_grad=True)
    x = torch.randn(64, 64, requires_grad=True)
    torch.manual_seed(3)
    a = kernels.dropout_add(r, x, 0.2, True)
    torch.manual_seed(3)
    b = kernels.dropout_add(r, x, 0.2, True)
    assert torch.equal(a, b)  # the default generator drives the mask: seeding reproduces it
    a.sum().backward()
    assert torch.equal(r.grad, torch.ones_like(r))  # the residual passes through
    kept = (a - r).abs() > 0
    assert_close(x.grad, kept.float() / 0.8, rtol=1e-5, atol=0, what="dropout_add gradient")


@pytest.mark.numerics
def test_a_redrawn_mask_gives_the_stored_masks_bits_and_generator():
    """``redraw`` keeps the generator state, not the mask: its output, its gradient (taken
    after other draws moved the generator on) and the generator after the forward are the
    stored mask's, bit for bit -- and the backward's draw leaves the generator untouched."""
    got = {}
    for redraw in (False, True):
        torch.manual_seed(4)
        x = torch.randn(3, 40, 50, requires_grad=True)
        y = kernels.dropout(x, 0.3, True, redraw=redraw)
        after_forward = torch.rand(5)  # the next draw: the forward moved the generator alike
        torch.randn(1000)  # draws between the passes, as a model's later layers make
        y.backward(torch.randn(y.shape, generator=torch.Generator().manual_seed(1)))
        got[redraw] = (y.detach(), x.grad, after_forward, torch.rand(5))
    for name, a, b in zip(("output", "gradient", "next draw", "draw after backward"),
                          got[False], got[True], strict=True):
        assert torch.equal(a, b), name
    assert (got[True][1] == 0).float().mean().item() == pytest.approx(0.3, abs=0.03)


def _one_draw_mask(shape: tuple[int, ...], p: float) -> torch.Tensor:
    """The keep mask's definition in one call: 64-bit words, four 15-bit lanes each."""
    n = math.prod(shape)
    words = torch.empty(-(-n // 4), dtype=torch.int64).random_()
    return ((words.view(torch.int16)[:n] & 0x7FFF) >= round(p * 2**15)).view(shape)


@pytest.mark.numerics
@pytest.mark.parametrize("shape", [(3,), (5, 7), (2, 9, 11, 3), (1, 113)])
def test_a_large_mask_drawn_in_chunks_has_one_draws_bits(monkeypatch, shape):
    """A CPU mask larger than a chunk of words is drawn chunk by chunk (2 MiB of words alive,
    not two bytes per element): the same bits, and the generator left where one draw of all
    the words leaves it -- chunks of 7 words here, so most shapes end in a partial chunk."""
    dropout_module = sys.modules["folnet.ops.primitives.dropout"]
    monkeypatch.setattr(dropout_module, "_CHUNK_WORDS", 7)
    torch.manual_seed(11)
    want, after_want = _one_draw_mask(shape, 0.3), torch.rand(3)
    torch.manual_seed(11)
    got, after_got = kernels.keep_mask(shape, 0.3, "cpu"), torch.rand(3)
    assert got.dtype == torch.bool and got.shape == shape
    assert torch.equal(got, want) and torch.equal(after_got, after_want)


def test_a_large_masks_scratch_is_one_chunk():
    """What drawing a whole square's mask allocates besides the mask: one chunk of words (the
    one-call draw held 3 bytes per element more, two of them on the heap)."""
    from torch.profiler import ProfilerActivity, profile

    dropout_module = sys.modules["folnet.ops.primitives.dropout"]
    n = 8 * dropout_module._CHUNK_WORDS * 4 + 5  # 8 chunks and a partial one
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        mask = kernels.keep_mask((n,), 0.1, "cpu")
    sizes = sorted(e.cpu_memory_usage for e in prof.events() if e.cpu_memory_usage > 0)
    assert mask.numel() == n and abs(1 - mask.float().mean().item() - 0.1) < 0.01
    assert sizes[-1] == n  # the mask itself, one byte per element
    assert sum(sizes[:-1]) <= 8 * dropout_module._CHUNK_WORDS + 4096  # one chunk of int64


def test_flop_counter_sees_onednn_products():
    x, w = _params((100, 32), (64, 32))
    with FlopCounterMode(display=False) as counter:
        kernels.linear(x, w).sum().backward()
    assert counter.get_total_flops() == 3 * 2 * 100 * 32 * 64


@pytest.mark.parametrize("p", [0.0, 0.5])
def test_dropout_extremes(p):
    x = torch.randn(1000)
    y = kernels.dropout(x, p, True)
    assert (y == 0).float().mean().item() == pytest.approx(p, abs=0.06)
