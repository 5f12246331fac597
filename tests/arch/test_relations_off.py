"""Without the final binary stream (the default: ``model.relations = False``, no
``output_relations``) the last layer skips its binary-stream updates, which no loss reads, so
the loss and every gradient are those of the full computation."""

from __future__ import annotations

import pytest
import torch
from batches import pretraining_batch
from tolerances import assert_close

import folnet

pytestmark = pytest.mark.usefixtures("one_thread")


def _loss_and_grads(model, relations, batch):
    model.relations = relations
    model.zero_grad(set_to_none=True)
    ids, types, labels, nsp = batch
    out = model(ids, types, mlm_labels=labels, nsp_labels=nsp)
    out.loss.backward()
    grads = {n: None if p.grad is None else p.grad.clone() for n, p in model.named_parameters()}
    return out, grads


@pytest.mark.numerics
@pytest.mark.parametrize(("ops", "position", "checkpointing"), [
    ("jmc.atp", "rpe", False),  # the fused einsum path
    ("jmc.atp", "rpe*", False),  # the compiled path (static relative embeddings)
    ("j.at", "rpe", True)])
def test_same_loss_and_gradients_without_the_final_relations(ops, position, checkpointing):
    torch.manual_seed(0)
    model = folnet.build_model(ops, preset="tiny", head="pretraining", vocab_size=300,
                               dropout=0.0, attention_dropout=0.0, position=position).train()
    model.set_activation_checkpointing(checkpointing)
    batch = pretraining_batch()
    full, g_full = _loss_and_grads(model, True, batch)
    lean, g_lean = _loss_and_grads(model, False, batch)
    assert full.relation_output is not None and lean.relation_output is None
    assert_close(lean.loss, full.loss, rtol=1e-6, atol=1e-6, what="loss")
    assert_close(lean.sequence_output, full.sequence_output, rtol=1e-5, atol=1e-5,
                 what="sequence_output")
    reached = 0
    for name, g in g_full.items():
        if g is None:
            assert g_lean[name] is None, name
            continue
        reached += 1
        # the same gradients through a smaller graph, accumulated in another order: measured
        # up to 4.8e-6 relative (token types) on two kernel sets
        assert_close(g_lean[name], g, rtol=1e-4, atol=1e-6, what=f"gradient of {name}")
    assert reached > 10
    last = f"encoder.layers.{model.cfg.L - 1}.ffn_b."
    assert all(g_full[n] is None for n in g_full if n.startswith(last))  # unused either way


def test_relations_only_when_asked_for_multiple_choice_too():
    """No head reads the final binary stream, so it is computed only when a call asks for it
    (``output_relations=True``) or the model's ``relations`` is on."""
    torch.manual_seed(0)
    model = folnet.build_model("j.a", preset="tiny", head="multiple-choice", vocab_size=300)
    assert model.relations is False
    ids = torch.randint(5, 300, (2, 3, 10))
    out = model(ids)
    assert out.relation_output is None and out.logits.shape == (2, 3)
    assert model(ids, output_relations=True).relation_output.shape[:4] == (2, 3, 10, 10)
    model.relations = True
    assert model(ids).relation_output.shape[:4] == (2, 3, 10, 10)
    assert model(ids, output_relations=False).relation_output is None
