"""The benchmark baseline computes the same function as folnet (so comparisons are fair)."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from baseline import BaselineFolnet

import folnet


def test_baseline_matches_folnet():
    torch.manual_seed(0)
    model = folnet.build_model("jmc.atp", preset="tiny", head="pretraining", vocab_size=300).eval()
    base = BaselineFolnet(model).eval()
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(5, 300, (2, 20), generator=g)
    types = torch.zeros_like(ids)
    types[:, 10:] = 1
    labels = torch.full_like(ids, -100)
    labels[:, 4] = ids[:, 4]
    nsp = torch.tensor([0, 1])
    with torch.no_grad():
        a = model(ids, types, mlm_labels=labels, nsp_labels=nsp)
        b = base(ids, types, mlm_labels=labels, nsp_labels=nsp)
    torch.testing.assert_close(a.sequence_output, b.sequence_output, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(a.relation_output, b.relation_output, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(a.loss, b.loss, rtol=1e-5, atol=1e-5)
