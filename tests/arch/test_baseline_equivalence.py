"""The benchmark baseline computes the same function as folnet (so comparisons are fair)."""

from __future__ import annotations

import pytest
import torch
from baseline import BaselineFolnet
from batches import pretraining_batch
from tolerances import assert_close

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
