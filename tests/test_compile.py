"""``torch.compile`` of the encoder (``folnet pretrain --compile``): it must trace through the
CPU fast paths (whose oneDNN linear inductor cannot lower for trainable weights) and give the
eager loss and gradients."""

from __future__ import annotations

import pytest
import torch

import folnet

pytestmark = pytest.mark.usefixtures("one_thread")


def _loss_and_grads(model, batch):
    model.zero_grad(set_to_none=True)
    ids, types, labels, nsp = batch
    out = model(ids, types, mlm_labels=labels, nsp_labels=nsp)
    out.loss.backward()
    return out.loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()
                               if p.grad is not None}


def test_compiled_encoder_matches_eager():
    torch.manual_seed(0)
    model = folnet.build_model("jmc.atp", preset="tiny", head="pretraining", vocab_size=300)
    model.eval()  # no dropout: both runs see the same function
    model.relations = False  # as `folnet pretrain` runs it
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(5, 300, (2, 10), generator=g)
    types = torch.zeros_like(ids)
    types[:, 5:] = 1
    labels = torch.full_like(ids, -100)
    labels[:, 2] = ids[:, 2]
    labels[:, 7] = ids[:, 7]
    batch = (ids, types, labels, torch.tensor([1, 0]))
    loss, grads = _loss_and_grads(model, batch)
    torch._dynamo.reset()
    model.encoder.compile()
    try:
        c_loss, c_grads = _loss_and_grads(model, batch)
    finally:
        torch._dynamo.reset()
    assert loss.item() > 1.0
    torch.testing.assert_close(c_loss, loss, rtol=1e-5, atol=1e-5)
    assert len(grads) > 20
    for name in c_grads.keys() - grads.keys():  # unused in eager (None), zeros when compiled
        assert not c_grads[name].any(), name
    for name, grad in grads.items():
        assert grad.abs().sum() > 0, name
        torch.testing.assert_close(c_grads[name], grad, rtol=1e-4, atol=1e-5, msg=name)
