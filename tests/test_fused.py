"""The fused path's einsum terms (folnet/arch/fused.py): values against a float64 loop, and the
order handed to torch.einsum, which decides the memory layout of the gradients."""

from __future__ import annotations

import pytest
import torch

from folnet.arch.fused import output_letters, plan_operator, run_terms
from folnet.ops.registry import get_operator

B, T, H, S = 2, 5, 3, 4


def _cjoin_inputs():
    g = torch.Generator().manual_seed(0)
    K = torch.randn(B, T, S, H, generator=g, dtype=torch.float64)  # K_sh(a): (b, a, s, h)
    v_cf = torch.randn(B, S, T, T, generator=g, dtype=torch.float64)  # v_s(a, y), channels first
    return K.requires_grad_(), v_cf.requires_grad_()


def test_cjoin_term_matches_loop_and_returns_premise_gradient_in_its_layout():
    spec = get_operator("c")
    plan = plan_operator(spec, {"h": H, "s": S}, d_in={"kernel": 16, "premise": 8},
                         biases={"kernel": False, "premise": True}, batch=B, seq_len=T)
    assert not plan.folded("kernel") and not plan.folded("premise")
    K, v_cf = _cjoin_inputs()
    v = v_cf.permute(0, 2, 3, 1)  # (b, a, y, s) view of the channels-first tensor
    letters = output_letters(spec)  # b y s h
    out = run_terms(plan, {"kernel": [K], "premise": [v]}, {}, (B, T, S, H), letters)
    want = torch.zeros(B, T, S, H, dtype=torch.float64)
    for b in range(B):
        for y in range(T):
            for s in range(S):
                for h in range(H):
                    want[b, y, s, h] = sum(K[b, a, s, h] * v_cf[b, s, a, y] for a in range(T))
    torch.testing.assert_close(out, want)
    (grad_v,) = torch.autograd.grad(out, v_cf, torch.randn_like(out))
    # the kernel is the left factor, so the premise's gradient comes back channels first as
    # the premise was made -- not transposed (a B x S x T x T copy per layer on the real sizes)
    assert grad_v.is_contiguous()


@pytest.mark.parametrize("symbol", ["j", "c", "a", "t", "p"])
def test_two_operand_terms_put_shared_letters_then_kernel_letters_first(symbol):
    spec = get_operator(symbol)
    sizes = {c: 4 for c, _ in spec.sizes}
    plan = plan_operator(spec, sizes, d_in={"kernel": 16, "premise": 16},
                         biases={"kernel": False, "premise": False})
    for term in plan.terms:
        ins, order = term.equation.split("->")
        subs = ins.split(",")
        assert sorted(order) == sorted(term.out_letters)
        if len(subs) == 2:
            free = [c for c in order if not (c in subs[0] and c in subs[1])]
            owners = [0 if c in subs[0] else 1 for c in free]
            assert owners == sorted(owners)  # every kernel letter before every premise letter
