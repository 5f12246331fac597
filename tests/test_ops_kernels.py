"""Compiled operators against loop references, gradients, backends, causal and padding masks."""

from __future__ import annotations

import pytest
import torch
from loops import CAUSAL_LOOPS, LOOPS
from opdata import SIZES, inputs, leading, perturb_after, perturb_tokens

import folnet
from folnet.ops.backends import BACKENDS, Call, attention_layout
from folnet.ops.compiler import compile_operator

BUILTINS = "bcjmapt"
ALL_OPS = [s.symbol for s in folnet.operators()]
OTHER_BACKENDS = [name for name in BACKENDS if name != "einsum"]


def _fits(symbol: str, backend: str) -> bool:
    """Whether a backend can run an operator at all (attention shape for the fused ones);
    combinations that cannot are not generated, so skips mean 'unavailable here' only."""
    return backend == "einsum" or attention_layout(folnet.get_operator(symbol)) is not None


def pairs(backends):
    return [(s, b) for s in ALL_OPS for b in backends if _fits(s, b)]


@pytest.mark.parametrize("symbol", BUILTINS)
def test_builtin_matches_loop_reference(symbol):
    spec = folnet.get_operator(symbol)
    k, v = inputs(spec, seed=1)
    got = compile_operator(symbol, "einsum")(k, v)
    want = LOOPS[symbol](k, v)
    assert got.dtype == torch.float64
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    assert want.abs().sum() > 0


@pytest.mark.parametrize("symbol", sorted(CAUSAL_LOOPS))
def test_builtin_causal_matches_loop_reference(symbol):
    spec = folnet.get_operator(symbol)
    k, v = inputs(spec, seed=2)
    got = compile_operator(symbol, "einsum", causal=True)(k, v)
    want = LOOPS[symbol](k, v, causal=True)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    # the causal version really differs from the bidirectional one
    assert not torch.allclose(got, compile_operator(symbol, "einsum")(k, v))


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize(("symbol", "backend"), [p for p in pairs(BACKENDS) if p[0] in BUILTINS])
def test_gradcheck(symbol, backend, causal):
    spec = folnet.get_operator(symbol)
    small = {"x": 3, "y": 3, "a": 3, "h": 2, "s": 2, "w": 2}
    k, v = inputs(spec, seed=3, sizes=small, requires_grad=True)
    _skip_unless(spec, backend, k, causal)
    op = compile_operator(symbol, backend, causal=causal)
    assert torch.autograd.gradcheck(lambda a, b: op(a, b), (k, v), eps=1e-6, atol=1e-7)


def _skip_unless(spec, backend, tensor, causal, padded=False):
    reason = BACKENDS[backend].why_not(
        spec, Call(tensor.device, tensor.dtype, causal, padded, tensor.requires_grad))
    if reason is not None:
        pytest.skip(f"backend {backend!r} cannot run {spec.symbol!r} here: {reason}")


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.detach().double(), b.detach().double()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


@pytest.mark.parametrize("padded", [False, True])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("symbol", "backend"), pairs(OTHER_BACKENDS))
def test_backend_matches_einsum(symbol, backend, dtype, causal, padded):
    spec = folnet.get_operator(symbol)
    device = "cuda" if backend == "xformers" and torch.cuda.is_available() else "cpu"
    sizes = {**SIZES, "x": 16, "y": 16, "a": 16, "s": 8, "w": 8}
    k, v = inputs(spec, dtype=dtype, seed=4, sizes=sizes)
    k, v = k.to(device).requires_grad_(), v.to(device).requires_grad_()
    mask = None
    if padded:
        mask = torch.ones(2, 16, dtype=torch.bool, device=device)
        mask[1, 11:] = False
    _skip_unless(spec, backend, k, causal, padded)
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    ref_k, ref_v = k.detach().clone().requires_grad_(), v.detach().clone().requires_grad_()
    got = compile_operator(symbol, backend, causal=causal)(k, v, mask)
    want = compile_operator(symbol, "einsum", causal=causal)(ref_k, ref_v, mask)
    assert _rel(got, want) < tol
    seed_grad = torch.randn(want.shape, generator=torch.Generator().manual_seed(5)).to(want)
    got.backward(seed_grad)
    want.backward(seed_grad)
    assert _rel(k.grad, ref_k.grad) < tol
    assert _rel(v.grad, ref_v.grad) < tol


@pytest.mark.parametrize(("symbol", "backend"), pairs(BACKENDS))
def test_causal_no_leak(symbol, backend):
    """Perturbing every entry that involves a token after position t changes no output at or
    before t (unary and binary outputs alike)."""
    spec = folnet.get_operator(symbol)
    k, v = inputs(spec, dtype=torch.float32, seed=6)
    _skip_unless(spec, backend, k, True)
    op = compile_operator(symbol, backend, causal=True)
    base = op(k, v)
    for t in range(SIZES["x"] - 1):
        k2 = perturb_after(k, spec.kernel, t, seed=10 + t)
        v2 = perturb_after(v, spec.premise, t, seed=20 + t)
        assert not torch.equal(k2, k) and not torch.equal(v2, v)
        out = op(k2, v2)
        assert torch.equal(leading(out, spec.output, t), leading(base, spec.output, t)), t


@pytest.mark.parametrize(("symbol", "backend"), pairs(BACKENDS))
def test_padding_excluded_from_reductions(symbol, backend):
    spec = folnet.get_operator(symbol)
    k, v = inputs(spec, dtype=torch.float32, seed=7)
    mask = torch.ones(2, SIZES["x"], dtype=torch.bool)
    mask[0, 3:] = False
    mask[1, 4:] = False
    _skip_unless(spec, backend, k, False, True)
    op = compile_operator(symbol, backend)
    base = op(k, v, mask)
    out = op(perturb_tokens(k, spec.kernel, ~mask, 1), perturb_tokens(v, spec.premise, ~mask, 2),
             mask)
    for b in range(2):
        n = int(mask[b].sum())
        torch.testing.assert_close(leading(out[b : b + 1], spec.output, n - 1),
                                   leading(base[b : b + 1], spec.output, n - 1),
                                   rtol=1e-6, atol=1e-6)
    if spec.activation == "softmax" and spec.rdim in "xya":
        # and the mask matters: without it the perturbation reaches real tokens
        free = compile_operator(symbol, backend)
        moved = free(perturb_tokens(k, spec.kernel, ~mask, 1),
                     perturb_tokens(v, spec.premise, ~mask, 2))
        assert not torch.allclose(leading(moved[:1], spec.output, 2),
                                  leading(free(k, v)[:1], spec.output, 2))


def test_auto_backend_is_explainable_and_matches_einsum():
    k, v = inputs(folnet.get_operator("t"), dtype=torch.float32, seed=8)
    op = compile_operator("t")
    text = op.explain(k, v)
    assert "runs on" in text and "xformers" in text and "sdpa" in text
    torch.testing.assert_close(op(k, v), compile_operator("t", "einsum")(k, v))


def test_compiled_operators_are_cached():
    assert compile_operator("j") is compile_operator("join")
    assert compile_operator("j", "einsum") is not compile_operator("j", "sdpa")
    assert "bxah,bahs->bxhs" in repr(compile_operator("j"))


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda k, v: (k[..., 0], v, None), r"kernel must have 4 dims"),
        (lambda k, v: (k, v[:, :, :1], None), r"index 'h' has size 2 in the kernel but 1"),
        (lambda k, v: (k, v.long(), None), r"premise must be floating point"),
        (lambda k, v: (k, v, torch.ones(2, 5)), r"mask must be a bool tensor"),
        (lambda k, v: (k, v, torch.ones(3, 5, dtype=torch.bool)), r"mask must have shape"),
    ],
)
def test_bad_call_arguments(make, match):
    spec = folnet.get_operator("j")
    k, v = inputs(spec, dtype=torch.float32)
    with pytest.raises(folnet.FolnetError, match=match):
        compile_operator("j")(*make(k, v))


def test_forced_backend_that_cannot_run_says_why():
    # reasons of the spec alone fail at compile time (a model fails when it is built)...
    with pytest.raises(folnet.FolnetError, match=r"cannot run on backend 'sdpa'.*attention shape"):
        compile_operator("a", "sdpa")
    with pytest.raises(folnet.FolnetError, match=r"'c' cannot run on backend 'xformers'.*causal"):
        compile_operator("c", "xformers", causal=True)
    with pytest.raises(folnet.FolnetError, match=r"'a' cannot run on backend 'sdpa'.*shape"):
        folnet.build_model("jmc.atp", preset="tiny", backend="sdpa")
    with pytest.raises(folnet.FolnetError, match=r"'c' cannot run on backend 'sdpa'.*causal"):
        folnet.build_model("jmc.t", preset="tiny", kind="decoder", backend="sdpa")
    # ... reasons of the call when it comes
    op = compile_operator("j", "sdpa")
    k, v = inputs(folnet.get_operator("j"), dtype=torch.float32)
    with pytest.raises(folnet.FolnetError, match=r"cannot run on backend 'sdpa'.*dtype"):
        op.select(Call(k.device, torch.complex64, False, False, False))
    assert op(k, v).shape == (k.shape[0], 5, 2, 3)
    with pytest.raises(folnet.FolnetError, match="backend 'cuda' is unknown"):
        compile_operator("a", "cuda")


@pytest.mark.parametrize(("symbol", "backend"), pairs(BACKENDS))
def test_prefix_visibility(symbol, backend):
    """A PrefixLM's visibility: prefix positions see the whole prefix, targets stay causal."""
    from folnet.ops.masks import prefix_visibility

    spec = folnet.get_operator(symbol)
    k, v = inputs(spec, dtype=torch.float32, seed=9)
    _skip_unless(spec, backend, k, True)
    op = compile_operator(symbol, backend, causal=True)
    visible = prefix_visibility(torch.tensor([3, 3]), SIZES["x"])
    base = op(k, v, visible=visible)
    # nothing after the prefix leaks into positions <= 3
    out = op(perturb_after(k, spec.kernel, 3, 1), perturb_after(v, spec.premise, 3, 2),
             visible=visible)
    assert torch.equal(leading(out, spec.output, 3), leading(base, spec.output, 3))
    if spec.rdim == "a" and symbol != "c":
        # prefix position 0 now depends on prefix position 2 (it would not under plain causal)
        out = op(perturb_after(k, spec.kernel, 1, 3), perturb_after(v, spec.premise, 1, 4),
                 visible=visible)
        assert not torch.allclose(leading(out, spec.output, 0), leading(base, spec.output, 0))
    with pytest.raises(folnet.FolnetError, match="visible must be a bool"):
        op(k, v, visible=visible.long())
