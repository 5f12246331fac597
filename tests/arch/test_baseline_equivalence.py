"""The benchmark baseline computes the same function as folnet (so comparisons are fair), and
both compute the released code's function: checked against the independent float64 reference
of tests/released_reference.py, which reads no operator spec -- a spec that went wrong would
change folnet and the baseline alike (the baseline reads the model's specs), so only a
reference written from the released code's facts can see it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from baseline import BaselineFolnet
from batches import pretraining_batch
from paths import OFFICIAL
from released_reference import released_forward
from tolerances import assert_close, assert_rel

import folnet


@pytest.mark.numerics
def test_baseline_matches_folnet():
    torch.manual_seed(0)
    model = folnet.build_model("jmc.atp", preset="tiny", head="pretraining", vocab_size=300).eval()
    model.relations = True  # the baseline computes the final binary stream
    base = BaselineFolnet(model).eval()
    ids, types, labels, nsp = pretraining_batch(T=20, masked=[4])
    with torch.no_grad():
        a = model(ids, types, mlm_labels=labels, nsp_labels=nsp)
        b = base(ids, types, mlm_labels=labels, nsp_labels=nsp)
    for name in ("sequence_output", "relation_output", "loss"):
        assert_close(getattr(a, name), getattr(b, name), rtol=1e-5, atol=1e-5, what=name)


@pytest.mark.numerics
def test_folnet_and_the_baseline_compute_the_released_function_on_new_weights(tmp_path):
    """The released fixture's weights moved by random noise (every operator of jmc.atp, both
    heads), loaded through load_official: folnet and the baseline against the reference."""
    sd = torch.load(str(OFFICIAL) + ".pt", weights_only=True)
    g = torch.Generator().manual_seed(11)
    noisy = {k: v + 0.05 * torch.randn(v.shape, generator=g) if v.is_floating_point() else v
             for k, v in sd.items()}
    noisy["cls.heads.predictions.decoder.weight"] = noisy["folnet.encoder.word_embd.weight"]
    prefix = tmp_path / "noisy"
    torch.save(noisy, str(prefix) + ".pt")
    cfg_text = Path(str(OFFICIAL) + ".cfg").read_text()
    (tmp_path / "noisy.cfg").write_text(cfg_text)
    model = folnet.load_official(prefix).double().eval()
    model.relations = True
    ids = torch.randint(5, 900, (1, 9), generator=g)
    types = torch.zeros_like(ids)
    types[:, 5:] = 1
    want = released_forward(noisy, json.loads(cfg_text), ids, types)
    with torch.no_grad():
        ours = model(ids, types)
        base = BaselineFolnet(model).eval()(ids, types)
    for name in ("sequence_output", "relation_output", "pooled_output"):
        assert_rel(getattr(ours, name), want[name], 1e-10, f"folnet {name}")
    for name in ("sequence_output", "relation_output"):  # what the baseline computes
        assert_rel(getattr(base, name), want[name], 1e-10, f"baseline {name}")
