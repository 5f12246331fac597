"""LAMB against the published rule, learning-rate schedules, weight-decay groups, AMP helpers."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch
from tolerances import assert_close

import folnet
from folnet.errors import FolnetError
from folnet.train.engine.amp import autocast, check_precision, make_grad_scaler
from folnet.train.engine.optim import (
    Lamb,
    WarmupDecay,
    build_optimizer,
    build_scheduler,
    parameter_groups,
    warmup_steps_for,
)


def reference_lamb(weights, grads_per_step, *, lr, betas, eps, weight_decays):
    """LAMB as printed in You et al. (ICLR 2020), Algorithm 2, with phi = identity, in numpy
    float64: one list of tensors per step; returns the weights after every step."""
    b1, b2 = betas
    w = [np.array(x, dtype=np.float64) for x in weights]
    m = [np.zeros_like(x) for x in w]
    v = [np.zeros_like(x) for x in w]
    history = []
    for t, grads in enumerate(grads_per_step, start=1):
        for i, g in enumerate(grads):
            g = np.asarray(g, dtype=np.float64)
            m[i] = b1 * m[i] + (1 - b1) * g
            v[i] = b2 * v[i] + (1 - b2) * g * g
            m_hat = m[i] / (1 - b1**t)
            v_hat = v[i] / (1 - b2**t)
            r = m_hat / (np.sqrt(v_hat) + eps) + weight_decays[i] * w[i]
            w_norm, r_norm = np.linalg.norm(w[i]), np.linalg.norm(r)
            ratio = w_norm / r_norm if w_norm > 0 and r_norm > 0 else 1.0
            w[i] = w[i] - lr * ratio * r
        history.append([x.copy() for x in w])
    return history


@pytest.mark.numerics
def test_lamb_matches_the_published_update_rule():
    gen = torch.Generator().manual_seed(0)
    shapes = [(5, 3), (3,), (4,), (2, 2)]
    init = [torch.randn(s, generator=gen, dtype=torch.float64) for s in shapes]
    init[1].zero_()  # a zero tensor (a fresh bias): trust ratio 1 on the first step
    decays = [0.01, 0.0, 0.1, 0.0]
    steps = [[torch.randn(s, generator=gen, dtype=torch.float64) for s in shapes]
             for _ in range(6)]
    steps[0][3].zero_()  # first step of tensor 3: m = v = 0, so r = 0 and ratio must be 1
    params = [torch.nn.Parameter(x.clone()) for x in init]
    groups = [{"params": [p], "weight_decay": wd} for p, wd in zip(params, decays, strict=True)]
    opt = Lamb(groups, lr=0.05, betas=(0.9, 0.999), eps=1e-6)
    expected = reference_lamb([x.numpy() for x in init], [[g.numpy() for g in s] for s in steps],
                              lr=0.05, betas=(0.9, 0.999), eps=1e-6, weight_decays=decays)
    for grads, want in zip(steps, expected, strict=True):
        for p, g in zip(params, grads, strict=True):
            p.grad = g.clone()
        opt.step()
        for p, w in zip(params, want, strict=True):
            assert_close(p.detach(), torch.from_numpy(w), rtol=1e-12, atol=1e-14,
                         what="LAMB step")
    # The trust ratio really acts: the step of a decayed tensor scales with its norm.
    assert not np.allclose(expected[-1][0], init[0].numpy())


def test_lamb_state_dict_round_trip_continues_identically():
    torch.manual_seed(0)
    a = torch.nn.Linear(4, 3)
    b = torch.nn.Linear(4, 3)
    b.load_state_dict(a.state_dict())
    opt_a = Lamb(a.parameters(), lr=0.01, weight_decay=0.01)
    x = torch.randn(8, 4)
    for _ in range(3):
        a(x).square().sum().backward()
        opt_a.step()
        opt_a.zero_grad()
    b.load_state_dict(a.state_dict())
    opt_b = Lamb(b.parameters(), lr=0.01, weight_decay=0.01)
    opt_b.load_state_dict(copy.deepcopy(opt_a.state_dict()))  # as if read from disk
    for model, opt in ((a, opt_a), (b, opt_b)):
        model(x).square().sum().backward()
        opt.step()
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters(), strict=True))


def test_lamb_rejects_bad_hyperparameters():
    p = [torch.nn.Parameter(torch.zeros(2))]
    with pytest.raises(FolnetError, match="betas"):
        Lamb(p, betas=(1.0, 0.9))
    with pytest.raises(FolnetError, match="lr"):
        Lamb(p, lr=-1.0)


def test_warmup_then_linear_decay_at_known_steps():
    rule = WarmupDecay(total_steps=100, warmup_steps=10, schedule="linear")
    assert [rule(s) for s in (0, 5, 10)] == [0.0, 0.5, 1.0]
    assert rule(55) == pytest.approx(0.5)
    assert rule(100) == 0.0 and rule(120) == 0.0
    assert warmup_steps_for(100, 0.01) == 1 and warmup_steps_for(8000, 0.01) == 80
    assert warmup_steps_for(10, 0.06) == 1  # ceil, as Hugging Face does


def test_polynomial_and_constant_schedules():
    poly = WarmupDecay(100, 10, "polynomial", power=2.0, end_factor=0.1)
    assert poly(10) == pytest.approx(1.0)
    assert poly(55) == pytest.approx(0.1 + 0.9 * 0.25)
    assert poly(100) == pytest.approx(0.1)
    const = WarmupDecay(100, 4, "constant")
    assert const(2) == 0.5 and const(4) == 1.0 and const(99) == 1.0
    with pytest.raises(FolnetError, match="schedule"):
        WarmupDecay(100, 10, "cosine")


def test_scheduler_drives_the_optimizer_learning_rate():
    p = torch.nn.Parameter(torch.ones(3))
    opt = Lamb([p], lr=0.2)
    sched = build_scheduler(opt, 20, warmup_ratio=0.2)  # warmup 4 steps, then linear to 0
    seen = []
    for _ in range(20):
        seen.append(opt.param_groups[0]["lr"])
        p.grad = torch.ones(3)
        opt.step()
        sched.step()
    assert seen[:5] == pytest.approx([0.0, 0.05, 0.1, 0.15, 0.2])
    assert seen[12] == pytest.approx(0.2 * (20 - 12) / 16)
    restored = build_scheduler(Lamb([p], lr=0.2), 20, warmup_ratio=0.2)
    restored.load_state_dict(sched.state_dict())
    assert restored.get_last_lr() == sched.get_last_lr()


def test_weight_decay_groups_exclude_every_bias():
    model = folnet.build_model("jmc.atp", preset="tiny", head="pretraining", vocab_size=100)
    decay, keep = parameter_groups(model, 0.01)
    assert decay["weight_decay"] == 0.01 and keep["weight_decay"] == 0.0
    names = dict(model.named_parameters())
    assert set(decay["names"]) | set(keep["names"]) == set(names)
    assert set(keep["names"]) == {n for n in names if n.endswith("bias")}
    assert "mlm.bias" in keep["names"] and "encoder.atoms.word.weight" in decay["names"]
    opt = build_optimizer(model, "adamw", lr=1e-3, weight_decay=0.01)
    assert isinstance(opt, torch.optim.AdamW)
    assert [g["weight_decay"] for g in opt.param_groups] == [0.01, 0.0]
    assert isinstance(build_optimizer(model, "lamb"), Lamb)  # no Apex here
    with pytest.raises(FolnetError, match="optimizer 'sgd'"):
        build_optimizer(model, "sgd")


def test_amp_helpers():
    cpu = torch.device("cpu")
    assert make_grad_scaler("fp16", cpu).is_enabled()
    assert not make_grad_scaler("bf16", cpu).is_enabled()
    assert not make_grad_scaler("fp32", cpu).is_enabled()
    x = torch.randn(4, 4)
    with autocast("bf16", cpu):
        assert (x @ x).dtype == torch.bfloat16
    with autocast("fp32", cpu):
        assert (x @ x).dtype == torch.float32
    with pytest.raises(FolnetError, match="precision 'fp8'"):
        check_precision("fp8", cpu)
    assert math.isfinite(float((x @ x).sum()))
