"""The fused backend's einsum terms (folnet/ops/backends/fused.py): values against a float64
loop, the order handed to torch.einsum (which decides the memory layout of the gradients), the
fold plan, and the bias-times-bias term of an operator with both tensors folded."""

from __future__ import annotations

import pytest
import torch
from tolerances import assert_close

import folnet
from folnet.ops import Operand, compile_operator
from folnet.ops.backends import BACKENDS
from folnet.ops.backends.fused import fold_choice, output_letters, run_terms, terms
from folnet.ops.registry import get_operator

B, T, H, S = 2, 5, 3, 4
DIMS = {"D1": 64, "D2": 16, "H": 4, "S": 16, "F1": 128, "F2": 32}


def _cjoin_inputs():
    g = torch.Generator().manual_seed(0)
    K = torch.randn(B, T, S, H, generator=g, dtype=torch.float64)  # K_sh(a): (b, a, s, h)
    v_cf = torch.randn(B, S, T, T, generator=g, dtype=torch.float64)  # v_s(a, y), channels first
    return K.requires_grad_(), v_cf.requires_grad_()


@pytest.mark.numerics
def test_cjoin_term_matches_loop_and_returns_premise_gradient_in_its_layout():
    spec = get_operator("c")
    plan = terms(spec, (False, False), (False, True))
    K, v_cf = _cjoin_inputs()
    v = v_cf.permute(0, 2, 3, 1)  # (b, a, y, s) view of the channels-first tensor
    letters = output_letters(spec)  # b x s h
    sizes = {"b": B, "x": T, "s": S, "h": H}
    out = run_terms(plan, {"kernel": [K], "premise": [v]}, {}, sizes, letters)
    want = torch.zeros(B, T, S, H, dtype=torch.float64)
    for b in range(B):
        for y in range(T):
            for s in range(S):
                for h in range(H):
                    want[b, y, s, h] = sum(K[b, a, s, h] * v_cf[b, s, a, y] for a in range(T))
    assert_close(out, want, rtol=1e-12, atol=1e-12, what="c's term against its loop")
    (grad_v,) = torch.autograd.grad(out, v_cf, torch.randn_like(out))
    # the kernel is the left factor, so the premise's gradient comes back channels first as
    # the premise was made -- not transposed (a B x S x T x T copy per layer on the real sizes)
    assert grad_v.is_contiguous()


@pytest.mark.parametrize("symbol", ["j", "c", "a", "t", "p"])
def test_two_operand_terms_put_shared_letters_then_kernel_letters_first(symbol):
    spec = get_operator(symbol)
    for folded in ((False, False), (False, True)):
        for term in terms(spec, folded, (False, False)):
            ins, order = term.equation.split("->")
            subs = ins.split(",")
            assert sorted(order) == sorted(term.out_letters)
            if len(subs) == 2:
                free = [c for c in order if not (c in subs[0] and c in subs[1])]
                owners = [0 if c in subs[0] else 1 for c in free]
                assert owners == sorted(owners)  # every kernel letter before premise letters


def test_fold_choice_folds_the_cheap_binary_premises_only():
    plans = {s: dict(fold_choice(get_operator(s), tuple(sorted(DIMS.items())))) for s in "jmcapt"}
    assert plans["p"] == {"kernel": False, "premise": True}  # never builds B x T x T x S
    assert not plans["j"]["kernel"] and not plans["t"]["kernel"]  # softmax kernels materialise
    assert not plans["a"]["kernel"] and not plans["a"]["premise"]  # unary tensors


@pytest.fixture
def identity_trans():
    """B <- B x B with an identity kernel reducing over a token: both tensors fold, and the
    bias-times-bias term lacks the reduced token (its size multiplies the term)."""
    spec = folnet.register_operator(symbol="r", name="sum_trans", typing="B <- B x B",
                                    kernel="x a h", premise="a y h", output="x y h", bdim="h",
                                    rdim="a")
    yield spec
    folnet.unregister_operator("r")


@pytest.mark.numerics
@pytest.mark.parametrize("n", [3, 7])
def test_both_folded_with_biases_scale_by_the_actual_length(identity_trans, n):
    spec = identity_trans
    g = torch.Generator().manual_seed(1)
    stream = torch.randn(2, n, n, 6, generator=g, dtype=torch.float64)
    wk, wp = (torch.randn(2, 6, generator=g, dtype=torch.float64) for _ in range(2))
    bk, bp = (torch.randn(2, generator=g, dtype=torch.float64) for _ in range(2))
    op = compile_operator(spec)
    got = op.run(Operand(stream, ("x", "a"), weight=wk, bias=bk),
                 Operand(stream, ("a", "y"), weight=wp, bias=bp), None, order=None,
                 route=op.route_by(BACKENDS["fused"]))
    K = torch.einsum("bxad,hd->bxah", stream, wk) + bk
    v = torch.einsum("bayd,hd->bayh", stream, wp) + bp
    want = torch.einsum("bxah,bayh->bxyh", K, v)
    assert_close(got, want, rtol=1e-12, atol=1e-12, what=f"both folded, n = {n}")
