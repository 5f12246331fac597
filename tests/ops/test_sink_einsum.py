"""`folnet.ops.primitives.sink.sink_einsum`: an operand's gradient added to its sink in place
equals autograd's (float64), through the batched-product path where the sink's memory allows it and
through the einsum fallback where it does not; the forward is torch.einsum's."""

from __future__ import annotations

import pytest
import torch
from tolerances import assert_close
from torch.utils._python_dispatch import TorchDispatchMode

from folnet.errors import FolnetError
from folnet.ops.primitives.sink import sink_einsum

pytestmark = pytest.mark.numerics

CASES = [  # equation, left shape, right shape
    ("bhxa,bhay->bhxy", (2, 3, 4, 5), (2, 3, 5, 6)),  # t, channels first
    ("bxah,bayh->bxyh", (2, 4, 5, 3), (2, 5, 6, 3)),  # t, channels last
    ("bxhw,byhw->bxyh", (2, 4, 3, 2), (2, 5, 3, 2)),  # a: two contracted letters
    ("bxa,bayz->bxyz", (2, 4, 5), (2, 5, 6, 7)),  # a letter of the right operand only
]


class _Ops(TorchDispatchMode):
    """Records the aten ops run under it."""

    def __init__(self):
        super().__init__()
        self.names: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.append(func.__name__)
        return func(*args, **(kwargs or {}))


def _operands(left_shape, right_shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(left_shape, generator=g, dtype=torch.float64, requires_grad=True)
    b = torch.randn(right_shape, generator=g, dtype=torch.float64, requires_grad=True)
    return a, b


@pytest.mark.parametrize("equation,left_shape,right_shape", CASES)
@pytest.mark.parametrize("transposed", [False, True])
def test_sinks_receive_autograds_gradients(equation, left_shape, right_shape, transposed):
    a, b = _operands(left_shape, right_shape)
    ref = torch.einsum(equation, a, b)
    g = torch.randn(ref.shape, generator=torch.Generator().manual_seed(1), dtype=ref.dtype)
    want_a, want_b = torch.autograd.grad(ref, (a, b), g)
    # the right operand's sink: its own layout, or memory in the reverse order (a view)
    sink_b = (torch.zeros(b.shape[::-1], dtype=b.dtype).permute(*reversed(range(b.ndim)))
              if transposed else torch.zeros_like(b))
    sink_b += 0.5  # gradients are added to what the sink holds
    out = sink_einsum(equation, a, b, sinks=(None, sink_b))
    assert_close(out, ref, rtol=1e-12, atol=1e-12, what=f"{equation} forward")
    (got_a,) = torch.autograd.grad(out, (a,), g)
    assert_close(got_a, want_a, rtol=1e-12, atol=1e-12, what=f"{equation} left gradient")
    assert_close(sink_b, want_b + 0.5, rtol=1e-12, atol=1e-12, what=f"{equation} right sink")
    # and the left operand's, with the right returned through autograd
    sink_a = torch.zeros_like(a)
    out = sink_einsum(equation, a, b, sinks=(sink_a, None))
    assert torch.autograd.grad(out, (a, b), g, allow_unused=True)[0] is None
    assert_close(sink_a, want_a, rtol=1e-12, atol=1e-12, what=f"{equation} left sink")


@pytest.mark.parametrize("memory,used,unused", [
    ("batched", "baddbmm_.default", "add_.Tensor"),  # t's channels-first premise: in place
    ("reversed", "add_.Tensor", "baddbmm_.default"),  # no batched view: einsum, then add_
])
def test_the_sinks_memory_order_picks_the_accumulation(memory, used, unused):
    a, b = _operands((2, 3, 4, 5), (2, 3, 5, 6))
    sink = (torch.zeros_like(b) if memory == "batched"
            else torch.zeros(b.shape[::-1], dtype=b.dtype).permute(3, 2, 1, 0))
    out = sink_einsum("bhxa,bhay->bhxy", a, b, sinks=(None, sink))
    with _Ops() as ops:
        out.backward(torch.ones_like(out))
    assert used in ops.names and unused not in ops.names
    assert b.grad is None and sink.abs().sum() > 0


def test_a_letter_summed_within_one_operand_leaves_the_gradients_to_autograd():
    a, b = _operands((2, 4, 5, 3), (2, 5, 6))
    sink = torch.zeros_like(b)
    out = sink_einsum("bxaw,bay->bxy", a, b, sinks=(None, sink))
    want = torch.autograd.grad(torch.einsum("bxaw,bay->bxy", a, b).sum(), b)[0]
    assert_close(torch.autograd.grad(out.sum(), b)[0], want, rtol=1e-12, atol=1e-12,
                 what="gradient through autograd")
    assert sink._version == 0  # untouched


def test_without_sinks_or_grad_it_is_einsum():
    a, b = _operands((2, 3, 4, 5), (2, 3, 5, 6))
    out = sink_einsum("bhxa,bhay->bhxy", a, b)
    assert "Sink" not in type(out.grad_fn).__name__  # torch.einsum's own graph
    with torch.no_grad():
        plain = sink_einsum("bhxa,bhay->bhxy", a, b, sinks=(None, torch.zeros_like(b)))
    assert plain.grad_fn is None
    assert torch.equal(plain, torch.einsum("bhxa,bhay->bhxy", a, b))  # the same call
    for bad in ("bhxa,bhay", "bhxa,bhay,bh->bhxy", "...xa,...ay->...xy"):
        with pytest.raises(FolnetError, match="explicit two-operand equation"):
            sink_einsum(bad, a, b, sinks=(None, torch.zeros_like(b)))


def test_under_autocast_operands_are_cast_once_and_the_sink_gets_the_gradient():
    a, b = (t.float() for t in _operands((2, 3, 4, 5), (2, 3, 5, 6)))
    a.retain_grad()
    ref_b = torch.autograd.grad(torch.einsum("bhxa,bhay->bhxy", a.bfloat16(), b.bfloat16())
                                .float().sum(), b)[0]
    sink = torch.zeros_like(b)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = sink_einsum("bhxa,bhay->bhxy", a, b, sinks=(None, sink))
    assert out.dtype == torch.bfloat16
    out.float().sum().backward()
    assert a.grad is not None and a.grad.dtype == torch.float32
    # bf16 keeps 8 significant bits: products of 5 terms rounded to it differ from the
    # reference's by a few units of 2**-8 = 0.4%; 2% is five of them
    assert_close(sink, ref_b, rtol=2e-2, atol=2e-2, what="sink under bf16 autocast")
