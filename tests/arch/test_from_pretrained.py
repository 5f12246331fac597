"""folnet.from_pretrained: model directories, run directories (final/, else the latest
checkpoint), a new head on a pretrained encoder, runtime overrides."""

from __future__ import annotations

import pytest
import torch

import folnet

V = 80


def _pretrained(seed=0):
    torch.manual_seed(seed)
    return folnet.build_model("jm.at", preset="tiny", vocab_size=V, head="pretraining").eval()


def _same_encoder(a, b) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return all(torch.equal(sa[k], sb[k]) for k in sa if k.startswith("encoder."))


def test_run_directories_resolve_to_final_else_the_latest_checkpoint(tmp_path):
    run = tmp_path / "run"
    early, late, final = _pretrained(1), _pretrained(2), _pretrained(3)
    early.save_pretrained(run / "checkpoints" / "step_5")
    late.save_pretrained(run / "checkpoints" / "step_10")
    (run / "checkpoints" / ".tmp-step_15-x").mkdir()  # a half-written save is never taken
    assert _same_encoder(folnet.from_pretrained(run), late)
    final.save_pretrained(run / "final")
    assert _same_encoder(folnet.from_pretrained(run), final)
    assert _same_encoder(folnet.from_pretrained(run / "checkpoints" / "step_5"), early)


def test_a_new_head_on_a_pretrained_encoder(tmp_path):
    pre = _pretrained()
    pre.save_pretrained(tmp_path / "pre")
    torch.manual_seed(7)
    clf = folnet.from_pretrained(tmp_path / "pre", head="classification", num_labels=3)
    assert clf.head == "classification" and _same_encoder(clf, pre)
    ids = torch.randint(5, V, (2, 10))
    assert clf.eval()(ids).logits.shape == (2, 3)
    bare = folnet.from_pretrained(tmp_path / "pre", head="none")
    assert bare.head is None and _same_encoder(bare, pre)
    assert folnet.from_pretrained(tmp_path / "pre", head="pretraining").head == "pretraining"
    with torch.no_grad():  # the same head keeps every weight
        kept = folnet.from_pretrained(tmp_path / "pre").eval()
        assert torch.equal(kept(ids).mlm_logits, pre(ids).mlm_logits)


def test_runtime_overrides_and_refusals(tmp_path):
    pre = _pretrained()
    pre.save_pretrained(tmp_path / "pre")
    model = folnet.from_pretrained(tmp_path / "pre", dropout=0.0, backend="einsum")
    assert model.cfg.dropout == 0.0 and model.cfg.backend == "einsum"
    with pytest.raises(folnet.FolnetError, match=r"\['D1'\] cannot be changed on a saved model"):
        folnet.from_pretrained(tmp_path / "pre", D1=32)
    lm = folnet.build_model("j.a", preset="tiny", kind="decoder", vocab_size=V)
    lm.save_pretrained(tmp_path / "lm")
    with pytest.raises(folnet.FolnetError, match=r"keeps its 'lm' head"):
        folnet.from_pretrained(tmp_path / "lm", head="classification")
    with pytest.raises(folnet.FolnetError, match=r"head 'ranking' is unknown"):
        folnet.from_pretrained(tmp_path / "pre", head="ranking")
