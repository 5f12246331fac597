"""The Triton kernels of the fused residual norm, run by Triton's interpreter on CPU tensors:
collected only by tests/ops/test_residual_norm.py, which runs this file in a process with
TRITON_INTERPRET=1 (not a test module of its own: its name does not start with test_)."""

from __future__ import annotations

import os

import pytest
import torch

from folnet.ops.primitives import residual_norm as rn

pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                reason="runs under TRITON_INTERPRET=1 only")


def _inputs(shape, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    u = torch.randn(shape, generator=g).to(dtype).requires_grad_()
    x = (torch.randn(shape, generator=g) * 0.7 + 0.3).to(dtype).requires_grad_()
    return u, x, torch.randn(shape, generator=g), torch.randn(shape, generator=g)


def _keep_of(seed_state: int, shape, p: float) -> torch.Tensor:
    """The mask the kernel draws under a seed state: its y with u = 0 and x = 1 is keep / (1-p)."""
    torch.manual_seed(seed_state)
    y, _ = rn.residual_norm(torch.zeros(shape), torch.ones(shape), p, 1e-12)
    return y != 0


@pytest.mark.parametrize(("shape", "p"), [((2, 7, 7, 24), 0.0), ((2, 7, 7, 24), 0.3),
                                          ((1, 33, 33, 48), 0.1)])
def test_the_kernels_are_the_eager_arithmetic(shape, p):
    keep = _keep_of(5, shape, p) if p else None
    u, x, gy, gn = _inputs(shape, torch.float32)
    torch.manual_seed(5)
    y, n = rn.residual_norm(u, x, p, 1e-12)
    (y * gy + n * gn).sum().backward()
    u64 = u.detach().double().requires_grad_()
    x64 = x.detach().double().requires_grad_()
    ry, rnorm = rn.reference(u64, x64, keep, p, 1e-12)
    (ry * gy.double() + rnorm * gn.double()).sum().backward()
    torch.testing.assert_close(y.double(), ry, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(n.double(), rnorm, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(u.grad.double(), u64.grad, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(x.grad.double(), x64.grad, rtol=1e-5, atol=1e-5)


def test_the_mask_is_a_dropout_mask_and_repeats_under_a_seed():
    shape = (2, 16, 16, 32)
    a, b, c = _keep_of(1, shape, 0.25), _keep_of(1, shape, 0.25), _keep_of(2, shape, 0.25)
    assert torch.equal(a, b) and not torch.equal(a, c)
    assert abs(a.float().mean().item() - 0.75) < 0.02


def test_bf16_stream_and_update():
    u, x, gy, gn = _inputs((2, 6, 6, 40), torch.bfloat16)
    y, n = rn.residual_norm(u, x, 0.0, 1e-12, torch.float32)
    (y.float() * gy + n * gn).sum().backward()
    assert y.dtype == torch.bfloat16 and n.dtype == torch.float32
    assert u.grad.dtype == torch.bfloat16 and x.grad.dtype == torch.bfloat16
    ry, rnorm = rn.reference(u.detach().double(), x.detach().double(), None, 0.0, 1e-12)
    torch.testing.assert_close(y.double(), ry, rtol=1e-2, atol=1e-2)  # y rounded to bf16
    torch.testing.assert_close(n.double(), rnorm, rtol=2e-2, atol=2e-2)


def test_only_the_norm_read():
    """y unread (its gradient None): the kernel takes n's gradient alone."""
    u, x, _, gn = _inputs((1, 5, 5, 16), torch.float32)
    _, n = rn.residual_norm(u, x, 0.0, 1e-12)
    (n * gn).sum().backward()
    u64 = u.detach().double().requires_grad_()
    _, rnorm = rn.reference(u64, x.detach().double(), None, 0.0, 1e-12)
    (rnorm * gn.double()).sum().backward()
    torch.testing.assert_close(u.grad.double(), u64.grad, rtol=1e-5, atol=1e-5)
