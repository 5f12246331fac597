"""`folnet.ops.primitives.layer_norm` passes ATen a weight of ones and a bias of zeros, for speed:
it must give the affine-free LayerNorm's bits, forward and backward, in every dtype, and on
both CPU kernel sets (marked numerics: `make test` runs it under the second one too)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

import folnet
from folnet.ops.primitives import layer_norm

pytestmark = pytest.mark.numerics

SHAPES = [(4, 9, 9, 16), (2, 33, 33, 32), (3, 17, 64), (5, 7)]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_the_bits_of_the_affine_free_layer_norm(shape, dtype):
    g = torch.Generator().manual_seed(hash(shape) % 1000)
    x = (torch.randn(shape, generator=g) * 3 + 0.7).to(dtype)
    up = torch.randn(shape, generator=g).to(dtype)
    width = shape[-1]
    a = x.clone().requires_grad_()
    b = x.clone().requires_grad_()
    ours = layer_norm(a, width, 1e-12)
    plain = F.layer_norm(b, (width,), eps=1e-12)
    assert torch.equal(ours, plain)
    ours.backward(up)
    plain.backward(up)
    assert torch.equal(a.grad, b.grad)
    # and it is a LayerNorm (float64 reference from its definition)
    x64 = x.double()
    mean = x64.mean(-1, keepdim=True)
    ref = (x64 - mean) / torch.sqrt(x64.var(-1, unbiased=False, keepdim=True) + 1e-12)
    tol = 1e-5 if dtype == torch.float32 else 1e-12 if dtype == torch.float64 else 3e-2
    assert torch.allclose(ours.double(), ref, atol=tol, rtol=0)


def test_under_cpu_autocast_the_same_bits():
    x = torch.randn(2, 12, 12, 16, generator=torch.Generator().manual_seed(3)) + 0.5
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ours = layer_norm(x, 16, 1e-12)
        plain = F.layer_norm(x, (16,), eps=1e-12)
    assert ours.dtype == plain.dtype and torch.equal(ours, plain)


def test_a_model_step_is_unchanged_by_it(monkeypatch):
    """A jmc.atp training step (dropout on) gives the same loss and gradients, bit for bit,
    with every LayerNorm on the plain affine-free call (the kernel's F swapped for one that
    drops the weight and bias it is given)."""
    import folnet.ops.primitives.norm as norm

    def step() -> tuple[torch.Tensor, list[torch.Tensor]]:
        torch.manual_seed(0)
        model = folnet.build_model("jmc.atp", preset="tiny", vocab_size=64, head="pretraining",
                                   dropout=0.1).train()
        g = torch.Generator().manual_seed(1)
        ids = torch.randint(5, 64, (3, 11), generator=g)
        labels = torch.where(torch.rand(3, 11, generator=g) < 0.3, ids, -100)
        loss = model(ids, mlm_labels=labels, nsp_labels=torch.tensor([0, 1, 0])).loss
        loss.backward()
        return loss.detach(), [p.grad.clone() for p in model.parameters() if p.grad is not None]

    loss, grads = step()
    calls = []

    def plain(x, shape, weight=None, bias=None, eps=1e-5):
        calls.append(tuple(x.shape))
        return F.layer_norm(x, shape, eps=eps)

    monkeypatch.setattr(norm, "F", SimpleNamespace(layer_norm=plain))
    plain_loss, plain_grads = step()
    assert len(calls) >= 8  # every LayerNorm of the model went through the kernel
    assert torch.equal(loss, plain_loss)
    assert len(grads) == len(plain_grads) > 10
    assert all(torch.equal(a, b) for a, b in zip(grads, plain_grads, strict=True))
