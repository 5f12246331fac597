"""folnet's LAMB over flat buckets (`folnet.train.engine.lamb`) against the per-tensor loop it
replaced, written out here as that loop was: the same bits on a CPU over 100 steps, the same
skip of a tensor without a gradient, a device-side skip that moves nothing, the state of a
checkpoint written before the buckets, and a launch count that does not grow with the tensors.
"""

from __future__ import annotations

import copy
import sys

import pytest
import torch
from paths import BENCHMARKS
from tolerances import assert_rel

import folnet
from folnet.train.engine.lamb import Lamb
from folnet.train.engine.optim import parameter_groups

sys.path.insert(0, str(BENCHMARKS))
from step_census import Step, census


class LoopLamb(torch.optim.Optimizer):
    """The per-tensor loop folnet's LAMB was until the buckets (bias corrections in Python
    floats, one tensor at a time): the reference the buckets must reproduce."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.0):
        super().__init__(params, {"lr": lr, "betas": betas, "eps": eps,
                                  "weight_decay": weight_decay})

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state["step"] = 0
                    state["exp_avg"] = torch.zeros_like(p)
                    state["exp_avg_sq"] = torch.zeros_like(p)
                state["step"] += 1
                t = state["step"]
                m, v = state["exp_avg"], state["exp_avg_sq"]
                m.mul_(beta1).add_(p.grad, alpha=1.0 - beta1)
                v.mul_(beta2).addcmul_(p.grad, p.grad, value=1.0 - beta2)
                update = (m / (1.0 - beta1**t)) / ((v / (1.0 - beta2**t)).sqrt()
                                                   + group["eps"])
                if group["weight_decay"] != 0.0:
                    update.add_(p, alpha=group["weight_decay"])
                w_norm, r_norm = torch.linalg.vector_norm(p), torch.linalg.vector_norm(update)
                usable = (w_norm > 0) & (r_norm > 0)
                ratio = torch.where(usable, w_norm / torch.where(usable, r_norm, 1.0), 1.0)
                p.add_(update * (-group["lr"] * ratio))


def _model(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return folnet.build_model("jmc.atp", preset="tiny", head="pretraining", vocab_size=60)


def _grads(model, step: int, missing: set[str] = frozenset()) -> dict[str, torch.Tensor]:
    """Random, non-zero gradients of every parameter but ``missing`` (seeded by ``step``)."""
    g = torch.Generator().manual_seed(1000 + step)
    return {n: None if n in missing else torch.randn(p.shape, generator=g) * 0.1
            for n, p in model.named_parameters()}


def _run(model, opt, steps: int, missing_at=lambda step: frozenset(), skip_at=()):
    for step in range(steps):
        for n, p in model.named_parameters():
            p.grad = _grads(model, step, missing_at(step))[n]
        if isinstance(opt, Lamb):
            opt.step(skip=torch.tensor(step in skip_at))
        elif step not in skip_at:
            opt.step()


def _same(a: torch.nn.Module, b: torch.nn.Module) -> None:
    for (name, x), y in zip(a.named_parameters(), b.parameters(), strict=True):
        assert torch.equal(x, y), f"{name} differs by {float((x - y).abs().max()):.3g}"


def test_the_buckets_give_the_loops_bits_over_100_steps():
    """Two groups (biases not decayed), 100 steps, and a tensor without a gradient on every
    third step (its moments and count stay; its bucket is made again): the weights and
    moments are the loop's, bit for bit."""
    ours, loop = _model(), _model()
    name = "encoder.layers.0.proj_u.weight"
    missing = lambda step: frozenset({name}) if step % 3 == 2 else frozenset()  # noqa: E731
    opt_ours = Lamb(parameter_groups(ours, 0.01), lr=3e-3)
    opt_loop = LoopLamb(parameter_groups(loop, 0.01), lr=3e-3)
    for step in range(100):
        for (n, p), q in zip(ours.named_parameters(), loop.parameters(), strict=True):
            p.grad = q.grad = _grads(ours, step, missing(step))[n]
        opt_ours.step()
        opt_loop.step()
    _same(ours, loop)
    for p, q in zip(ours.parameters(), loop.parameters(), strict=True):
        assert torch.equal(opt_ours.state[p]["exp_avg_sq"], opt_loop.state[q]["exp_avg_sq"])
        assert float(opt_ours.state[p]["step"]) == opt_loop.state[q]["step"]
    proj = dict(ours.named_parameters())[name]
    assert float(opt_ours.state[proj]["step"]) == 67  # 100 steps, 33 without its gradient


def test_a_step_skipped_on_the_device_moves_nothing():
    """``skip=True`` leaves every weight, moment and count as it was, so a run that skips
    steps 3 and 7 equals one that never called them (with NaN gradients at those steps)."""
    ours, loop = _model(), _model()
    opt_ours, opt_loop = Lamb(parameter_groups(ours, 0.01), lr=3e-3), LoopLamb(
        parameter_groups(loop, 0.01), lr=3e-3)
    before = None
    for step in range(10):
        for (n, p), q in zip(ours.named_parameters(), loop.parameters(), strict=True):
            g = _grads(ours, step)[n]
            q.grad = g
            p.grad = torch.full_like(g, float("nan")) if step in (3, 7) else g
        if step == 3:
            before = copy.deepcopy(opt_ours.state_dict()), [p.clone() for p in ours.parameters()]
        opt_ours.step(skip=torch.tensor(step in (3, 7)))
        if step == 3:
            after = opt_ours.state_dict()
            for p, q in zip(ours.parameters(), before[1], strict=True):
                assert torch.equal(p, q)
            for k, state in before[0]["state"].items():
                for key, value in state.items():
                    assert torch.equal(torch.as_tensor(value), torch.as_tensor(
                        after["state"][k][key])), (k, key)
        if step not in (3, 7):
            opt_loop.step()
    _same(ours, loop)


def test_a_state_saved_before_the_buckets_continues_as_the_loop_does():
    """A checkpoint's optimiser state from the per-tensor loop (integer steps, one tensor per
    moment) loads into the buckets and continues bit for bit."""
    ours, loop = _model(), _model()
    opt_loop = LoopLamb(parameter_groups(loop, 0.01), lr=3e-3)
    _run(loop, opt_loop, 5)
    ours.load_state_dict(loop.state_dict())
    opt_ours = Lamb(parameter_groups(ours, 0.01), lr=3e-3)
    saved = copy.deepcopy(opt_loop.state_dict())
    assert isinstance(next(iter(saved["state"].values()))["step"], int)
    opt_ours.load_state_dict(saved)
    for step in range(5, 12):
        for (n, p), q in zip(ours.named_parameters(), loop.parameters(), strict=True):
            p.grad = q.grad = _grads(ours, step)[n]
        opt_ours.step()
        opt_loop.step()
    _same(ours, loop)
    # and its own state round-trips through a file's deep copy
    again = _model()
    again.load_state_dict(ours.state_dict())
    opt_again = Lamb(parameter_groups(again, 0.01), lr=3e-3)
    opt_again.load_state_dict(copy.deepcopy(opt_ours.state_dict()))
    for opt, model in ((opt_ours, ours), (opt_again, again)):
        _run(model, opt, 3)
    _same(ours, again)


def test_half_precision_weights_step_in_float32():
    """bf16 weights: moments in float32, the update computed in float32 and rounded once."""
    torch.manual_seed(0)
    w = torch.randn(64, 32)
    p16, p32 = torch.nn.Parameter(w.bfloat16()), torch.nn.Parameter(w.bfloat16().float())
    opt16, opt32 = Lamb([p16], lr=1e-2, weight_decay=0.01), LoopLamb([p32], lr=1e-2,
                                                                      weight_decay=0.01)
    g = torch.randn(64, 32, generator=torch.Generator().manual_seed(1))
    p16.grad, p32.grad = g.bfloat16(), g.bfloat16().float()
    opt16.step()
    opt32.step()
    assert opt16.state[p16]["exp_avg"].dtype == torch.float32 and p16.dtype == torch.bfloat16
    # one rounding of the result to bf16 (8 bits: 2^-9 relative)
    assert_rel(p16.float(), p32, 2 * 2.0**-9, "bf16 LAMB step")


@pytest.mark.parametrize("preset", ["tiny", "small"])
def test_a_step_is_a_few_dozen_launches_whatever_the_tensors(preset):
    """About 30 launching ops per bucket; the loop made 22 per tensor (1,036 at tiny)."""
    torch.manual_seed(0)
    model = folnet.build_model("jmc.atp", preset=preset, head="pretraining")
    opt = Lamb(parameter_groups(model, 0.01), lr=1e-3)
    for p in model.parameters():
        p.grad = torch.randn_like(p)
    tensors = sum(1 for _ in model.parameters())
    for skip in (None, torch.tensor(False)):
        record = census(Step(model, opt, lambda name: None,
                             lambda skip=skip: opt.step(skip=skip)), warmup=1)
        assert record.launches() <= 40, (record.launches(), record.by(2).most_common(8))
        assert not record.syncs
    assert tensors > 40


def test_the_per_tensor_rule_counts_each_tensor_once_after_a_load():
    """After `load_state_dict` tensors of equal step counts share one step tensor (for the
    buckets); the per-tensor rule (FSDP's sharded tensors) must not count one tensor's step on
    all of them. It did: a resumed FSDP run's bias corrections drifted from the uninterrupted
    run's (1.2e-4 in the weights after two steps)."""
    a, b = torch.nn.Parameter(torch.ones(3)), torch.nn.Parameter(torch.ones(2))
    opt = Lamb([a, b], lr=0.1)
    for p in (a, b):
        p.grad = torch.full_like(p, 0.5)
    opt.step()
    opt.load_state_dict(opt.state_dict())
    assert opt.state[a]["step"] is opt.state[b]["step"]
    with torch.no_grad():
        for p in (a, b):
            opt.step_reference(opt.param_groups[0], p)
    assert float(opt.state[a]["step"]) == float(opt.state[b]["step"]) == 2.0
