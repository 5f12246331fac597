"""Outputs behave like transformers' ModelOutput without needing transformers: attribute, key
and index access, to_tuple(), None fields skipped, the loss first; pytree nodes; picklable."""

from __future__ import annotations

import pickle

import pytest
import torch
import torch.utils._pytree as pytree

import folnet
from folnet.arch.outputs import FolnetOutput, TextOutput


def _classifier_output(labels=True):
    torch.manual_seed(0)
    model = folnet.build_model("j.a", preset="tiny", vocab_size=50, head="classification",
                               num_labels=3)
    ids = torch.randint(5, 50, (2, 8))
    return model(ids, labels=torch.tensor([0, 2]) if labels else None)


def test_access_by_attribute_key_and_index_loss_first():
    out = _classifier_output()
    assert list(out.keys()) == ["loss", "sequence_output", "pooled_output", "logits"]
    assert out[0] is out["loss"] is out.loss  # the loss is set last by the head, shown first
    assert out[-1] is out.logits and out[1:3] == (out.sequence_output, out.pooled_output)
    assert out.to_tuple() == tuple(out.values()) and len(out.to_tuple()) == 4
    assert dict(out)["logits"] is out.logits and "mlm_logits" not in out
    with pytest.raises(KeyError):
        out["mlm_logits"]  # None fields are not in the dictionary view


def test_no_loss_no_key_and_fields_can_be_set():
    out = _classifier_output(labels=False)
    assert "loss" not in out and out[0] is out.sequence_output
    out["loss"] = torch.tensor(1.0)
    assert out[0] is out.loss and next(iter(out)) == "loss"
    out.logits = None
    assert "logits" not in out
    with pytest.raises(KeyError):
        out["nonsense"] = 1
    with pytest.raises(TypeError):
        del out["loss"]


def test_pytree_and_pickle_round_trips():
    out = TextOutput(logits=torch.ones(2, 3), loss=torch.tensor(0.5))
    leaves, spec = pytree.tree_flatten(out)
    assert [t.tolist() for t in leaves] == [0.5, [[1.0] * 3] * 2]
    back = pytree.tree_unflatten([t * 2 for t in leaves], spec)
    assert isinstance(back, TextOutput) and torch.equal(back.logits, torch.full((2, 3), 2.0))
    again = pickle.loads(pickle.dumps(out))
    assert isinstance(again, TextOutput) and list(again) == ["loss", "logits"]
    assert torch.equal(again.logits, out.logits)
    empty = FolnetOutput()
    assert empty.to_tuple() == () and len(empty) == 0
