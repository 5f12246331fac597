"""The masked-LM gather at static shapes (`folnet.arch.heads.gather_masked` with slots): the
loss and gradients of the exact gather, no host read, and a refusal where slots would drop
targets. Slots are a CUDA device's (and a trace's) choice: on a CPU, where a read costs
nothing, the exact gather stays -- these tests take the CUDA path through
`folnet.ops.primitives.device.emulate`."""

from __future__ import annotations

import pytest
import torch
from tolerances import assert_rel

import folnet
from folnet.errors import FolnetError
from folnet.ops.primitives.device import emulate

V = 40


def _batch(slots_used=(3, 5)):
    g = torch.Generator().manual_seed(4)
    ids = torch.randint(1, V, (2, 12), generator=g)
    labels = torch.full_like(ids, -100)
    for row, k in enumerate(slots_used):
        at = torch.randperm(12, generator=g)[:k]
        labels[row, at] = ids[row, at]
    return ids, labels


def _run(model, ids, labels, gather, path="cuda"):
    model.gather_mlm = gather
    model.zero_grad()
    with emulate(path):
        out = model(ids, mlm_labels=labels, nsp_labels=torch.tensor([0, 1]))
        out.loss.backward()
    return out, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.numerics
def test_slots_give_the_exact_gathers_loss_logits_and_gradients():
    torch.manual_seed(0)
    model = folnet.build_model("jmc.atp", preset="tiny", head="pretraining", vocab_size=V,
                               dropout=0.0)
    ids, labels = _batch()
    exact, grads = _run(model, ids, labels, True)
    fixed, grads_fixed = _run(model, ids, labels, 6)
    assert exact.mlm_logits.shape == (8, V) and fixed.mlm_logits.shape == (12, V)
    on_cpu, _ = _run(model, ids, labels, 6, path="cpu")  # the exact gather, its bits
    assert torch.equal(on_cpu.mlm_logits, _run(model, ids, labels, True, path="cpu")[0]
                       .mlm_logits)
    predicted = fixed.mlm_labels != -100
    assert int(predicted.sum()) == 8 and torch.equal(fixed.mlm_labels[predicted],
                                                     exact.mlm_labels)
    # the same rows, in the same order; the loss and gradients agree to float32 rounding
    assert_rel(fixed.mlm_logits[predicted], exact.mlm_logits, 1e-6, "gathered MLM logits")
    assert_rel(fixed.loss, exact.loss, 1e-6, "loss")
    for name, g in grads.items():
        assert_rel(grads_fixed[name], g, 1e-5, f"gradient of {name}")


def test_more_targets_in_a_row_than_slots_are_refused():
    torch.manual_seed(0)
    model = folnet.build_model("j.a", preset="tiny", head="pretraining", vocab_size=V)
    ids, labels = _batch((3, 7))
    model.gather_mlm = 6
    with pytest.raises(FolnetError, match=r"a row predicts 7 tokens, more than the model's "
                                          r"gather_mlm = 6"):  # (values checked: on the CPU)
        model(ids, mlm_labels=labels)
    model.gather_mlm = 20  # more slots than tokens: every position, as many as there are
    with emulate("cuda"):
        assert model(ids, mlm_labels=labels).mlm_logits.shape == (24, V)
