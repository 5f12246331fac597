"""Compiled operators against loop references, gradients, backends, causal and padding masks."""

from __future__ import annotations

import pytest
import torch
from loops import CAUSAL_LOOPS, LOOPS
from opdata import SIZES, inputs, leading, perturb_after, perturb_tokens
from tolerances import assert_close, assert_rel

import folnet
from folnet.ops.backends import BACKENDS, OpCall
from folnet.ops.compiler import compile_operator

pytestmark = pytest.mark.numerics

BUILTINS = "bcjmapt"
ALL_OPS = [s.symbol for s in folnet.operators()]
OTHER_BACKENDS = [name for name in BACKENDS if name != "einsum"]


def _fits(symbol: str, backend: str, causal: bool | None = None) -> bool:
    """Whether a backend can run an operator at all (attention shape for sdpa/xformers, no
    causal calls for fused; ``causal=None``: either way); combinations that cannot are not
    generated, so skips mean 'unavailable here' only."""
    spec = folnet.get_operator(symbol)
    modes = (False, True) if causal is None else (causal,)
    return any(BACKENDS[backend].why_not_spec(spec, c) is None for c in modes)


def pairs(backends, causal=None):
    return [(s, b) for s in ALL_OPS for b in backends if _fits(s, b, causal)]


@pytest.mark.parametrize("symbol", BUILTINS)
def test_builtin_matches_loop_reference(symbol):
    spec = folnet.get_operator(symbol)
    k, v = inputs(spec, seed=1)
    got = compile_operator(symbol, "einsum")(k, v)
    want = LOOPS[symbol](k, v)
    assert got.dtype == torch.float64
    assert_close(got, want, rtol=1e-12, atol=1e-12, what=f"{symbol} against its loop")
    assert want.abs().sum() > 0


@pytest.mark.parametrize("symbol", sorted(CAUSAL_LOOPS))
def test_builtin_causal_matches_loop_reference(symbol):
    spec = folnet.get_operator(symbol)
    k, v = inputs(spec, seed=2)
    got = compile_operator(symbol, "einsum", causal=True)(k, v)
    want = LOOPS[symbol](k, v, causal=True)
    assert_close(got, want, rtol=1e-12, atol=1e-12, what=f"causal {symbol} against its loop")
    # the causal version really differs from the bidirectional one
    assert not torch.allclose(got, compile_operator(symbol, "einsum")(k, v))


@pytest.mark.parametrize(("symbol", "backend", "causal"),
                         [(*p, c) for c in (False, True) for p in pairs(BACKENDS, c)
                          if p[0] in BUILTINS])
def test_gradcheck(symbol, backend, causal):
    spec = folnet.get_operator(symbol)
    small = {"x": 3, "y": 3, "a": 3, "h": 2, "s": 2, "w": 2}
    k, v = inputs(spec, seed=3, sizes=small, requires_grad=True)
    _skip_unless(spec, backend, k, causal)
    op = compile_operator(symbol, backend, causal=causal)
    assert torch.autograd.gradcheck(lambda a, b: op(a, b), (k, v), eps=1e-6, atol=1e-7)


def _skip_unless(spec, backend, tensor, causal, padded=False):
    reason = BACKENDS[backend].why_not(
        spec, OpCall(tensor.device, tensor.dtype, causal, padded, tensor.requires_grad))
    if reason is not None:
        pytest.skip(f"backend {backend!r} cannot run {spec.symbol!r} here: {reason}")


@pytest.mark.parametrize("padded", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("symbol", "backend", "causal"),
                         [(*p, c) for c in (False, True) for p in pairs(OTHER_BACKENDS, c)])
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
    # bf16 keeps 8 significant bits: one rounding moves a value by up to 2**-9 = 2e-3, and the
    # two backends round their intermediates in different places (measured up to 3.8e-3).
    # 5e-2 leaves 13x; a wrong contraction is off by O(1).
    tol = 1e-5 if dtype == torch.float32 else 5e-2
    ref_k, ref_v = k.detach().clone().requires_grad_(), v.detach().clone().requires_grad_()
    got = compile_operator(symbol, backend, causal=causal)(k, v, mask)
    want = compile_operator(symbol, "einsum", causal=causal)(ref_k, ref_v, mask)
    assert_rel(got, want, tol, f"{backend} {symbol} {dtype} output")
    seed_grad = torch.randn(want.shape, generator=torch.Generator().manual_seed(5)).to(want)
    got.backward(seed_grad)
    want.backward(seed_grad)
    assert_rel(k.grad, ref_k.grad, tol, f"{backend} {symbol} {dtype} kernel gradient")
    assert_rel(v.grad, ref_v.grad, tol, f"{backend} {symbol} {dtype} premise gradient")


@pytest.mark.parametrize(("symbol", "backend"), pairs(BACKENDS, causal=True))
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


@pytest.mark.parametrize(("symbol", "backend"), pairs(BACKENDS, causal=False))
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
        assert_close(leading(out[b : b + 1], spec.output, n - 1),
                     leading(base[b : b + 1], spec.output, n - 1), rtol=1e-6, atol=1e-6,
                     what=f"{backend} {symbol} with perturbed pads")
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
    assert_close(op(k, v), compile_operator("t", "einsum")(k, v), rtol=1e-5, atol=1e-5,
                 what="t on auto")


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
        op.select(OpCall(k.device, torch.complex64, False, False, False))
    assert op(k, v).shape == (k.shape[0], 5, 2, 3)
    with pytest.raises(folnet.FolnetError, match="backend 'cuda' is unknown"):
        compile_operator("a", "cuda")


@pytest.mark.parametrize(("symbol", "backend"), pairs(BACKENDS, causal=True))
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


def test_auto_priority_is_one_table_and_explain_names_the_fused_path():
    """auto takes the first backend of the device's PRIORITY that supports the call; a
    layer's operator (compiled with the model's dims) says how it wants its operands."""
    from folnet.ops.backends import PRIORITY

    assert PRIORITY["cpu"][0] == "fused" and PRIORITY["cuda"] == ("xformers", "einsum", "sdpa")
    dims = {"D1": 64, "D2": 16, "H": 4, "S": 16, "F1": 128, "F2": 32}
    p = compile_operator("p", dims=dims)
    k, v = inputs(folnet.get_operator("p"), dtype=torch.float32)
    text = p.explain(k, v)
    assert "runs on 'fused' (kernel cl, premise fold)" in text, text
    causal = compile_operator("p", causal=True, dims=dims)
    text = causal.explain(k, v)
    assert "runs on 'einsum'" in text and "fused: causal masks apply" in text, text
    # query rows never take the fused path either
    call = OpCall(k.device, k.dtype, False, False, False, rows=True)
    assert compile_operator("p", dims=dims).select(call).name == "einsum"


@pytest.fixture
def bprod():
    """A registered operator with a binary identity kernel: the fused backend folds it."""
    spec = folnet.register_operator(symbol="q", name="bprod_fold", typing="B <- B x U",
                                    kernel="x y w", premise="x h w", output="x y h",
                                    bdim="x", rdim="w")
    yield spec
    folnet.unregister_operator("q")


@pytest.mark.parametrize("symbol", ["c", "m", "p", "t", "q"])  # those with a foldable tensor
def test_fused_backend_folds_and_matches_einsum(symbol, request):
    """The fused backend fed folded projections (the stream and the weight rows) equals the
    einsum backend on the materialised kernel and premise, gradients included (float64)."""
    from folnet.ops import Operand
    from folnet.ops.backends import BACKENDS as ALL

    spec = request.getfixturevalue("bprod") if symbol == "q" else folnet.get_operator(symbol)
    g = torch.Generator().manual_seed(11)
    B, T, D = 2, 5, 6
    sizes = {"x": T, "y": T, "a": T, "h": 2, "s": 3, "w": 4}
    operands, ref = {}, {}
    for role in ("kernel", "premise"):
        idx = spec.tensor(role)
        toks = [c for c in idx if c in "xya"]
        chans = [c for c in idx if c not in "xya"]
        cshape = [sizes[c] for c in chans]
        if spec.stream(role) == "B" and not (role == "kernel" and spec.activation == "softmax"):
            stream = torch.randn(B, T, T, D, generator=g, dtype=torch.float64,
                                 requires_grad=True)
            w = torch.randn(*cshape, D, generator=g, dtype=torch.float64, requires_grad=True)
            b = torch.randn(*cshape, generator=g, dtype=torch.float64, requires_grad=True)
            operands[role] = Operand(stream, tuple(toks), weight=w, bias=b)
            dense = torch.einsum("bxyd,...d->bxy...", stream, w) + b  # (B, T, T, *channels)
            ref[role] = Operand(dense, (*toks, *chans)).laid_out(idx)
        else:
            t = torch.randn(B, *(sizes[c] for c in idx), generator=g, dtype=torch.float64,
                            requires_grad=True)
            operands[role], ref[role] = Operand(t, idx), t
    assert any(o.folded for o in operands.values())
    op = compile_operator(spec)
    got = op.run(operands["kernel"], operands["premise"], None, order=None,
                 route=op.route_by(ALL["fused"]))
    want = compile_operator(spec, "einsum")(ref["kernel"], ref["premise"])
    assert_close(got, want, rtol=1e-12, atol=1e-12, what=f"fused {symbol}")
    grads = torch.randn(want.shape, generator=g, dtype=torch.float64)
    leaves = [t for o in operands.values()
              for t in (o.tensor, o.weight, o.bias) if t is not None]
    got_g = torch.autograd.grad(got, leaves, grads)
    want_g = torch.autograd.grad(want, leaves, grads)
    for a, b in zip(got_g, want_g, strict=True):
        assert_close(a, b, rtol=1e-10, atol=1e-10, what=f"fused {symbol} gradient")


@pytest.mark.parametrize("symbol", [s for s in BUILTINS if s != "b"])
def test_rows_equal_the_square_at_those_rows(symbol):
    """op.rows: a causal operator at some query rows against the whole domain (visibility and
    padding over the domain) gives the full call's outputs at those rows."""
    from folnet.ops.masks import causal_form, prefix_visibility

    spec = causal_form(folnet.get_operator(symbol))
    sizes = {"x": 6, "y": 6, "a": 6, "h": 2, "s": 3, "w": 4}
    g = torch.Generator().manual_seed(3)
    K = torch.randn(2, *(sizes[c] for c in spec.kernel), generator=g, dtype=torch.float64)
    v = torch.randn(2, *(sizes[c] for c in spec.premise), generator=g, dtype=torch.float64)
    visible = prefix_visibility(torch.tensor([2, 0]), 6)
    pad = torch.ones(2, 6, dtype=torch.bool)
    pad[1, 0] = False
    op = compile_operator(spec, causal=True)
    full = op(K, v, pad, visible=visible)
    # every row: the same computation as the square's
    assert torch.equal(op.rows(K, v, rows=torch.arange(6), visible=visible, mask=pad), full)
    pick = torch.tensor([1, 4])  # two query rows against the whole domain
    q = spec.output[0]
    Ks = K.index_select(1 + spec.kernel.index(q), pick) if q in spec.kernel else K
    vs = v.index_select(1 + spec.premise.index(q), pick) if q in spec.premise else v
    got = op.rows(Ks, vs, rows=pick, visible=visible, mask=pad)
    assert_close(got, full.index_select(1, pick), rtol=1e-12, atol=1e-12,
                 what=f"{symbol} at two rows")
    with pytest.raises(folnet.FolnetError, match="query index 'x' has"):
        op.rows(K, v, rows=pick, visible=visible)
