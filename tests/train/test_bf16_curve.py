"""bf16 autocast trains like float32: the loss curve of the first steps stays within 2% (the
performance issue's bar), on a tiny model and the learnable batches of benchmarks/bf16_curve.py."""

from __future__ import annotations

import argparse
import sys

import pytest
import torch
from paths import BENCHMARKS

sys.path.insert(0, str(BENCHMARKS))
from bf16_curve import compare, curve, learnable_batch
from tolerances import assert_at_most

import folnet

pytestmark = pytest.mark.usefixtures("one_thread")


def _args(**kw):
    base = {"preset": "tiny", "vocab_size": 600, "seq_len": 32, "batch": 8, "steps": 25,
            "lr": 2e-3}
    return argparse.Namespace(**{**base, **kw})


def test_learnable_batch_layout():
    ids, types, labels, nsp = learnable_batch(4, 32, 600, seed=3)
    assert ids.shape == types.shape == labels.shape == (4, 32)
    assert (ids[:, 0] == 2).all() and (ids[:, 15] == 3).all() and (ids[:, 30] == 3).all()
    masked = labels != -100
    assert (ids[masked] == 4).all()  # every labelled position is replaced by [MASK]
    assert masked.sum(1).eq(5).all()  # 15% of 32, rounded
    assert (types[:, 16:] == 1).all() and (types[:, :16] == 0).all()
    again = learnable_batch(4, 32, 600, seed=3)
    assert all(torch.equal(a, b) for a, b in zip((ids, types, labels, nsp), again, strict=True))


@pytest.mark.slow
@pytest.mark.numerics
@pytest.mark.parametrize("ops", ["jmc.atp", "j.a"])
def test_bf16_loss_curve_within_two_percent(ops):
    args = _args()
    fp32 = curve(ops, args, bf16=False)
    bf16 = curve(ops, args, bf16=True)
    assert fp32[-1] < fp32[0] - 0.5  # the model learns, so the curves are worth comparing
    r = compare(fp32, bf16)
    assert_at_most(r["max_rel_diff"], 0.02, f"{ops} bf16 loss curve")
    assert bf16 != fp32  # bf16 did run: rounding shows in the losses


def test_bf16_autocast_reaches_the_heads():
    torch.manual_seed(0)
    model = folnet.build_model("jmc.atp", preset="tiny", head="pretraining", vocab_size=600)
    ids, types, labels, nsp = learnable_batch(2, 32, 600, seed=0)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(ids, types, mlm_labels=labels, nsp_labels=nsp)
    assert out.mlm_logits.dtype == torch.bfloat16
