"""`folnet.ops.primitives.recompute`: outputs and every gradient equal plain autograd over the
whole tensor (float64), with a prologue, row and column slabs, parameters and dropout."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
import torch.utils.checkpoint
from tolerances import assert_close, assert_rel

from folnet.ops.primitives.owned import incoming_alone
from folnet.ops.primitives.recompute import Block, Prologue, Slab, recompute_blocks
from folnet.ops.primitives.sink import sink_einsum

pytestmark = pytest.mark.numerics

B, T, D, H = 2, 9, 5, 3


def _setup(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(B, T, T, D, generator=g, dtype=torch.float64, requires_grad=True)
    u = torch.randn(B, T, D, generator=g, dtype=torch.float64, requires_grad=True)
    w = torch.randn(H, D, generator=g, dtype=torch.float64, requires_grad=True)
    v = torch.randn(H, D, generator=g, dtype=torch.float64, requires_grad=True)
    return x, u, w, v


def _reference(x, u, w, v, p: float = 0.0):
    """A t-like product over the whole square: every row reads the shared premise whole, plus
    a term from the column slab x(:, i) and a unary one."""
    shared = F.linear(x, v).tanh()  # (B, a, y, H): every row reads it whole
    kernel = F.linear(x, w)  # (B, x, a, H): row slab
    kernel = F.dropout(kernel, p) if p else kernel
    out_b = torch.einsum("bxah,bayh->bxyh", kernel.softmax(2), shared)  # (B, T, T, H)
    across = F.linear(x.transpose(1, 2), w)  # (B, x, a, H) from x(a, x): the column slab
    out_b = out_b + across.sigmoid()
    out_u = (F.linear(u, w) * out_b.mean(2)).sum(-1, keepdim=True)  # (B, T, 1)
    return out_u, out_b


def _blocked(x, u, w, v, rows: int, p: float = 0.0, sink: bool = False, release=None):
    def shared(block: Block):  # rows r0:r1 of the shared premise (dim 1)
        return {"premise": F.linear(block.slabs["x rows"], v).tanh()}

    def run(block: Block):
        x_rows, x_cols = block.slabs["x rows"], block.slabs["x cols"]  # (B, R, T, D), (B, T, R, D)
        kernel = F.linear(x_rows, w)
        kernel = F.dropout(kernel, p) if p else kernel
        premise = block.made["premise"]
        if sink:  # the shared premise's gradient added to its sink in place
            sinks = None if block.sinks is None else block.sinks["premise"]
            out_b = sink_einsum("bxah,bayh->bxyh", kernel.softmax(2), premise,
                                sinks=(None, sinks))
        else:
            out_b = torch.einsum("bxah,bayh->bxyh", kernel.softmax(2), premise)
        out_b = out_b + F.linear(x_cols.transpose(1, 2), w).sigmoid()
        out_u = (F.linear(block.slabs["u rows"], w) * out_b.mean(2)).sum(-1, keepdim=True)
        return {"unary": out_u, "binary": out_b}

    spans = [(r0, min(T, r0 + rows)) for r0 in range(0, T, rows)]
    slabs = {"u rows": Slab("u", 1), "x rows": Slab("x", 1), "x cols": Slab("x", 2)}
    outs = recompute_blocks(run, spans, {"u": u, "x": x}, [w, v], slabs=slabs,
                            prologue=Prologue(shared, {"premise": 1}), release=release)
    assert list(outs) == ["unary", "binary"]
    return outs["unary"], outs["binary"]


def _grads(outs, tensors, seed=3):
    g = torch.Generator().manual_seed(seed)
    loss = sum((o * torch.randn(o.shape, generator=g, dtype=o.dtype)).sum() for o in outs)
    return torch.autograd.grad(loss, tensors)


def test_release_runs_at_the_start_and_the_end_of_the_backward_pass_only():
    """``release`` (the "tight" memory mode's heap release) is called once in the forward pass
    (before the first block) and twice in the backward pass -- before the first block is
    recomputed and after the prologue's gradients are in --, never without autograd, and
    changes nothing computed."""
    x, u, w, v = _setup()
    events: list[str] = []
    real_add = torch.Tensor.add_

    def release():
        events.append("release")

    ref = _blocked(x, u, w, v, 4)
    ref_grads = _grads(ref, (x, u, w, v))
    got = _blocked(x, u, w, v, 4, release=release)
    assert events == ["release"]  # the forward pass, before its blocks
    with torch.no_grad():
        _blocked(x.detach(), u.detach(), w.detach(), v.detach(), 4, release=release)
    assert events == ["release"]
    events.clear()
    try:  # every in-place add of the backward pass (the totals, the sinks) is logged
        torch.Tensor.add_ = lambda self, *a, **k: (events.append("add"), real_add(self, *a,
                                                                                     **k))[1]
        grads = _grads(got, (x, u, w, v))
    finally:
        torch.Tensor.add_ = real_add
    assert events.count("release") == 2 and events.count("add") > 4
    assert events[0] == "release" and events[-1] == "release"
    for name, a, b in zip("xuwv", grads, ref_grads, strict=True):
        assert torch.equal(a, b), f"gradient of {name} changed by the release"


@pytest.mark.parametrize("sink", [False, True])
def test_equals_autograd_over_the_whole_square(sink):
    x, u, w, v = _setup()
    ref = _reference(x, u, w, v)
    ref_grads = _grads(ref, (x, u, w, v))
    for rows in (1, 2, 4, T):
        got = _blocked(x, u, w, v, rows, sink=sink)
        for name, a, b in zip(("unary", "binary"), got, ref, strict=True):
            assert_close(a, b, rtol=1e-12, atol=1e-12, what=f"{name} output, {rows} rows")
        for name, a, b in zip("xuwv", _grads(got, (x, u, w, v)), ref_grads, strict=True):
            assert_close(a, b, rtol=1e-10, atol=1e-12, what=f"gradient of {name}, {rows} rows")


def test_backward_redraws_each_blocks_dropout():
    """Gradients under dropout match central differences taken under the same seed: the
    backward pass's recomputation drew the masks its forward drew."""
    x, u, w, v = _setup(1)
    torch.manual_seed(7)
    analytic = _grads(_blocked(x, u, w, v, 4, p=0.4), (w,))[0]
    direction = torch.randn(w.shape, generator=torch.Generator().manual_seed(4),
                            dtype=w.dtype)
    values = []
    with torch.no_grad():
        for sign in (1, -1):
            torch.manual_seed(7)
            outs = _blocked(x, u, w + sign * 1e-6 * direction, v, 4, p=0.4)
            g = torch.Generator().manual_seed(3)
            values.append(sum((o * torch.randn(o.shape, generator=g, dtype=o.dtype)).sum()
                              for o in outs))
    numeric = (values[0] - values[1]) / 2e-6
    assert abs(numeric) > 1e-2
    # float64 central differences: truncation ~eps**2, rounding ~1e-16 / eps = 1e-10
    assert_rel((analytic * direction).sum(), numeric, 1e-6,
               "gradient against central differences")


def test_parameters_get_their_gradient_once_and_unused_outputs_stay_none():
    x, u, w, v = _setup(2)
    seen = []
    w.register_post_accumulate_grad_hook(lambda p: seen.append(p.grad.clone()))
    out_u, _ = _blocked(x, u, w, v, 2)
    out_u.sum().backward()  # the binary output unused
    assert len(seen) == 1  # one accumulation, as a DDP gradient hook expects
    expected = torch.autograd.grad(_reference(x, u, w, v)[0].sum(), w)[0]
    assert_close(seen[0], expected, rtol=1e-10, atol=1e-12, what="accumulated gradient")


def test_no_grad_is_a_plain_loop():
    x, u, w, v = _setup(3)
    with torch.no_grad():
        got = _blocked(x, u, w, v, 4)
        ref = _reference(x, u, w, v)
    for a, b in zip(got, ref, strict=True):
        assert a.grad_fn is None
        assert_close(a, b, rtol=1e-12, atol=1e-12, what="output without grad")


def test_inside_an_activation_checkpoint():
    """Under `torch.utils.checkpoint` (a model's activation checkpointing) the saved inputs can
    be unpacked once only: the gradients still equal plain autograd's."""
    x, u, w, v = _setup(4)
    ref_grads = _grads(_reference(x, u, w, v), (x, u, w, v))
    outs = torch.utils.checkpoint.checkpoint(lambda a, b: _blocked(a, b, w, v, 4), x, u,
                                             use_reentrant=False)
    for name, a, b in zip("xuwv", _grads(outs, (x, u, w, v)), ref_grads, strict=True):
        assert_close(a, b, rtol=1e-10, atol=1e-12, what=f"checkpointed gradient of {name}")


# -- a residual added inside: its input's gradient summed into the output's incoming one ------


def _residual_reference(x, u, w, v, m, fold: bool = False):
    """`_reference`'s binary output brought back to D channels (m: (D, H)), plus x; with
    ``fold``, plus a term that reads x whole (its column means)."""
    out_u, out_b = _reference(x, u, w, v)
    out_b = F.linear(out_b, m) + x
    if fold:
        out_b = out_b + x.mean(1, keepdim=True).tanh()
    return out_u, out_b


def _residual_blocked(x, u, w, v, m, rows: int, fold: bool = False):
    def shared(block: Block):
        return {"premise": F.linear(block.slabs["x rows"], v).tanh()}

    def run(block: Block):
        x_rows, x_cols = block.slabs["x rows"], block.slabs["x cols"]
        kernel = F.linear(x_rows, w).softmax(2)
        out_b = torch.einsum("bxah,bayh->bxyh", kernel, block.made["premise"])
        out_b = out_b + F.linear(x_cols.transpose(1, 2), w).sigmoid()
        out_u = (F.linear(block.slabs["u rows"], w) * out_b.mean(2)).sum(-1, keepdim=True)
        out_b = F.linear(out_b, m)
        if fold:  # every row of x, read whole by each block
            out_b = out_b + block.inputs["x"].mean(1, keepdim=True).tanh()
        return {"unary": out_u, "binary": out_b}

    spans = [(r0, min(T, r0 + rows)) for r0 in range(0, T, rows)]
    slabs = {"u rows": Slab("u", 1), "x rows": Slab("x", 1), "x cols": Slab("x", 2)}
    outs = recompute_blocks(run, spans, {"u": u, "x": x}, [w, v, m], slabs=slabs,
                            prologue=Prologue(shared, {"premise": 1}),
                            residual={"binary": "x"})
    return outs["unary"], outs["binary"]


def _pointer_of_grad(t: torch.Tensor, into: list):
    return t.register_hook(lambda g: into.append(g.data_ptr()))


@pytest.mark.parametrize("fold", [False, True])
def test_residual_inside_sums_into_the_incoming_gradient(fold):
    """Value and every gradient equal plain autograd's for every block size; the input's
    gradient is the output's incoming gradient itself (the same memory: no second square),
    the column slabs' gradients for rows not yet run having waited for them."""
    x, u, w, v = _setup(5)
    m = torch.randn(D, H, generator=torch.Generator().manual_seed(6), dtype=torch.float64,
                    requires_grad=True)
    ref = _residual_reference(x, u, w, v, m, fold)
    ref_grads = _grads(ref, (x, u, w, v, m))
    for rows in (1, 2, 4, T):
        got = _residual_blocked(x, u, w, v, m, rows, fold)
        for name, a, b in zip(("unary", "binary"), got, ref, strict=True):
            assert_close(a, b, rtol=1e-12, atol=1e-12, what=f"{name} output, {rows} rows")
        incoming, returned = [], []
        _pointer_of_grad(got[1], incoming)
        hook = _pointer_of_grad(x, returned)
        for name, a, b in zip("xuwvm", _grads(got, (x, u, w, v, m)), ref_grads, strict=True):
            assert b.abs().max() > 0
            assert_close(a, b, rtol=1e-10, atol=1e-12, what=f"gradient of {name}, {rows} rows")
        hook.remove()
        if _COUNTS:
            assert incoming == returned != []


def test_residual_inside_copies_an_incoming_gradient_another_node_holds():
    """When the incoming gradient is also another node's (an add hands both of its inputs the
    same tensor), it is copied, not written into: that node's input gradient stays right."""
    x, u, w, v = _setup(6)
    m = torch.randn(D, H, generator=torch.Generator().manual_seed(7), dtype=torch.float64,
                    requires_grad=True)
    other = torch.randn(B, T, T, D, generator=torch.Generator().manual_seed(8),
                        dtype=torch.float64, requires_grad=True)
    weight = torch.randn(B, T, T, D, generator=torch.Generator().manual_seed(9),
                         dtype=torch.float64)

    def loss(blocked: bool):
        side = other * 2.0  # made first: its node runs after the blocks' in the backward pass
        out = (_residual_blocked(x, u, w, v, m, 4) if blocked
               else _residual_reference(x, u, w, v, m))[1]
        return ((out + side) * weight).sum()  # the add hands out and side one gradient

    want = torch.autograd.grad(loss(False), (x, other, w))
    got = torch.autograd.grad(loss(True), (x, other, w))
    for name, a, b in zip(("x", "other", "w"), got, want, strict=True):
        assert_close(a, b, rtol=1e-10, atol=1e-12, what=f"gradient of {name}")
    assert torch.equal(got[1], 2.0 * weight)


_COUNTS = hasattr(torch.Tensor, "_use_count") and hasattr(torch._C, "_storage_Use_Count")


class _Record(torch.autograd.Function):
    """An identity whose backward records `incoming_alone` of the gradient it receives."""

    @staticmethod
    def forward(x: torch.Tensor, seen: list) -> torch.Tensor:
        return x.clone()

    @staticmethod
    def setup_context(ctx, inputs: tuple, output: torch.Tensor) -> None:
        ctx.seen = inputs[1]

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        ctx.seen.append(incoming_alone(grad))
        return grad, None


def test_incoming_alone_tells_a_gradient_autograd_alone_holds():
    """Inside a Function's backward: a product's fresh gradient is autograd's alone (where
    this torch has the counts); one an add also hands another node, a view of the loss's, and
    one a post-hook of the node will read are not."""
    x = torch.randn(4, 3, requires_grad=True)
    w = torch.randn(4, 3)

    def alone(make_loss, hook: bool = False) -> bool:
        seen: list = []
        side = x * 3.0  # made first: its node runs after _Record's
        y = _Record.apply(x, seen)
        if hook:
            y.grad_fn.register_hook(lambda grad_inputs, grad_outputs: None)
        torch.autograd.grad(make_loss(y, side), x)
        assert len(seen) == 1
        return seen[0]

    assert alone(lambda y, side: (y * w).sum()) == _COUNTS
    assert not alone(lambda y, side: ((y + side) * w).sum())
    assert not alone(lambda y, side: y.sum())  # the loss's gradient expanded: a view
    assert not alone(lambda y, side: (y * w).sum(), hook=True)


@pytest.mark.parametrize("watch", ["post hook", "retained"])
def test_residual_inside_leaves_what_others_see_of_the_incoming_gradient(watch):
    """A node's post-hook and a retained gradient read the output's incoming gradient after
    the blocks' backward has run: they see it as it came, not the input's total."""
    x, u, w, v = _setup(7)
    m = torch.randn(D, H, generator=torch.Generator().manual_seed(8), dtype=torch.float64,
                    requires_grad=True)
    weight = torch.randn(B, T, T, D, generator=torch.Generator().manual_seed(9),
                         dtype=torch.float64)
    out = _residual_blocked(x, u, w, v, m, 4)[1]
    seen = []
    if watch == "post hook":
        out.grad_fn.register_hook(lambda grad_inputs, grad_outputs: seen.append(
            grad_outputs[1].clone()))
    else:
        out.retain_grad()
    grad_x = torch.autograd.grad((out * weight).sum(), x)[0]
    incoming = seen[0] if seen else out.grad
    assert torch.equal(incoming, weight)
    want = torch.autograd.grad((_residual_reference(x, u, w, v, m)[1] * weight).sum(), x)[0]
    assert_close(grad_x, want, rtol=1e-10, atol=1e-12, what="gradient of x")
