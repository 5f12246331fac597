"""The fused residual norm (`folnet.ops.primitives.residual_norm`): its CPU form and its Triton
kernels against the eager arithmetic in float64, its "why not" answers, one graph under
torch.compile's tracer, and the layer that takes it against the layer that does not."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import folnet
from folnet.ops.primitives import residual_norm as rn
from folnet.ops.primitives.device import emulate
from folnet.ops.primitives.dropout import portable_masks

HERE = Path(__file__).resolve().parent


def _inputs(shape=(2, 5, 5, 24), dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    u = torch.randn(shape, generator=g).to(dtype).requires_grad_()
    x = (torch.randn(shape, generator=g) * 0.7 + 0.3).to(dtype).requires_grad_()
    gy = torch.randn(shape, generator=g)
    gn = torch.randn(shape, generator=g)
    return u, x, gy, gn


def _against_float64(u, x, gy, gn, p, keep):
    """y, n and the gradients of u and x by the eager arithmetic in float64 with ``keep``."""
    u64 = u.detach().double().requires_grad_()
    x64 = x.detach().double().requires_grad_()
    y, n = rn.reference(u64, x64, keep, p, 1e-12)
    (y * gy.double() + n * gn.double()).sum().backward()
    return y, n, u64.grad, x64.grad


@pytest.mark.parametrize("p", [0.0, 0.25])
def test_the_cpu_form_is_the_eager_arithmetic_values_and_gradients(p):
    u, x, gy, gn = _inputs()
    torch.manual_seed(3)
    y, n = rn.residual_norm(u, x, p, 1e-12)
    (y * gy + n * gn).sum().backward()
    torch.manual_seed(3)  # the same seed again: the keep mask the op drew
    seed = torch.randint(0, rn.MAX_ELEMENTS - 1, (1,), dtype=torch.int64)
    keep = rn._cpu_keep(u.shape, seed, p) if p else None
    if p:
        assert 0.6 < keep.float().mean() < 0.9  # a real mask, not all kept
    ry, rnorm, gu, gx = _against_float64(u, x, gy, gn, p, keep)
    torch.testing.assert_close(y.double(), ry, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(n.double(), rnorm, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(u.grad.double(), gu, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(x.grad.double(), gx, rtol=1e-5, atol=1e-5)


def test_the_norm_in_another_dtype():
    u, x, gy, gn = _inputs()
    y, n = rn.residual_norm(u, x, 0.0, 1e-12, torch.bfloat16)
    (y * gy + n.float() * gn).sum().backward()
    assert y.dtype == torch.float32 and n.dtype == torch.bfloat16
    ry, rnorm, gu, _ = _against_float64(u, x, gy, gn, 0.0, None)
    torch.testing.assert_close(y.double(), ry, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(n.double(), rnorm, rtol=1e-2, atol=1e-2)  # rounded to bf16
    # n's gradient arrives in bf16 too
    torch.testing.assert_close(u.grad.double(), gu, rtol=3e-2, atol=3e-2)


def test_why_not_names_each_refusal(monkeypatch):
    u, x, _, _ = _inputs()
    assert "CPU step runs its own kernels" in rn.why_not(u, x)
    with emulate("cuda"):
        assert rn.why_not(u, x) is None
        assert "visibility" in rn.why_not(u, x, causal=True)
        assert "shape (2, 5, 5, 3)" in rn.why_not(u, x[..., :3])
        assert "torch.int64" in rn.why_not(u.long(), x)
        wide = torch.zeros(1, 1, 1, rn.MAX_WIDTH + 1)
        assert "8193 channels" in rn.why_not(wide, wide)
        long = torch.zeros(1, 1, dtype=torch.bfloat16).expand(1 << 31, 1)  # no storage
        assert "32-bit" in rn.why_not(long, long)
        with portable_masks():
            assert "portable" in rn.why_not(u, x, p=0.1)
            assert rn.why_not(u, x, p=0.0) is None
        monkeypatch.setattr(rn, "transformed", lambda: True)
        assert "torch.func" in rn.why_not(u, x)


def test_the_op_is_one_node_of_one_graph():
    u, x, _, _ = _inputs()

    def step(a, b):
        y, n = rn.residual_norm(a, b, 0.1, 1e-12)
        return (y * 2 + n).sum()

    explained = torch._dynamo.explain(step)(u, x)
    assert explained.graph_count == 1 and explained.graph_break_count == 0
    assert "folnet.residual_norm" in str(explained.graphs[0].code) or any(
        "residual_norm" in str(node.target) for node in explained.graphs[0].graph.nodes)


@pytest.mark.parametrize("kind", ["encoder", "encoder-decoder"])
def test_a_layer_on_cuda_choices_takes_it_and_computes_the_eager_layer(kind, monkeypatch):
    """The emulated CUDA path with the fused op (the CPU form) against the same path refused
    it, dropout off: outputs and every gradient."""
    from folnet.arch.layer import dual_stream, mixer

    ran = []
    monkeypatch.setattr(mixer, "residual_norm",
                        lambda *a, **k: ran.append(1) or rn.residual_norm(*a, **k))

    def run(fused: bool):
        torch.manual_seed(0)
        model = folnet.build_model("jmc.atp", preset="tiny", kind=kind, vocab_size=50,
                                   dropout=0.0).train()
        ids = torch.randint(5, 50, (2, 9))
        extra = {"decoder_input_ids": ids[:, :6]} if kind == "encoder-decoder" else {}
        taken = []
        real = rn.why_not if fused else (lambda u, x, **kw: "refused by the test")
        monkeypatch.setattr(dual_stream, "fused_norm_why_not",
                            lambda u, x, **kw: taken.append(1) or real(u, x, **kw))
        with emulate("cuda"):
            out = model(input_ids=ids, **extra)
        hidden = out.last_hidden_state if hasattr(out, "last_hidden_state") else out[0]
        hidden.square().sum().backward()
        return hidden, {k: p.grad for k, p in model.named_parameters()}, len(taken)

    h0, g0, asked0 = run(False)
    assert not ran
    h1, g1, asked1 = run(True)
    # every layer but the last (which skips the binary stream's updates) asked, and fused
    assert asked0 == asked1 == len(ran) >= 1
    torch.testing.assert_close(h1, h0, rtol=1e-5, atol=1e-5)
    assert g0.keys() == g1.keys()
    for k in g0:
        if g0[k] is None:
            assert g1[k] is None, k
            continue
        torch.testing.assert_close(g1[k], g0[k], rtol=1e-4, atol=1e-5, msg=k)


def test_the_triton_kernels_under_the_interpreter():
    """The Triton kernels themselves, run by Triton's interpreter on CPU tensors, in a process
    of their own (the interpreter is chosen when Triton is first imported)."""
    pytest.importorskip("triton", reason="Triton is not installed: the dev extra installs it "
                                         "on Linux x86_64")
    env = dict(os.environ, TRITON_INTERPRET="1")
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                          str(HERE / "interpreted_residual_norm.py")],
                         env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    assert re.search(r"\b6 passed", run.stdout), run.stdout[-2000:]
