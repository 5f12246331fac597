"""benchmarks/step_census.py: what one training step launches, syncs and moves, held at the
targets the speed work reached (counts are deterministic: they do not depend on T, B or the
machine), and the census itself shown to see what it claims to count."""

from __future__ import annotations

import sys

import pytest
import torch
from paths import BENCHMARKS

sys.path.insert(0, str(BENCHMARKS))
import step_census as sc


def test_the_census_sees_syncs_views_and_launches():
    """The tool first: an item(), a boolean index and a tolist() of a device tensor are
    syncs, reading the host's own tensors is not; a view launches nothing, an add does."""
    model = torch.nn.Linear(4, 3)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    host = torch.ones(3)

    def run() -> None:
        y = model(torch.randn(2, 4))  # parameters are the device's: y is too
        float(host.sum())  # the host's own data: free
        _ = y.t()  # a view
        loss = y[y > 0].sum() + y.sum() * 0  # a boolean index
        loss.backward()
        float(loss)  # item
        y.detach().tolist()
        opt.step()
        opt.zero_grad()

    record = sc.census(sc.Step(model, opt, lambda name: None, run))
    ops = [op for *_, op in record.syncs]
    assert ops.count("index") == 1 and "tolist" in ops and "_local_scalar_dense" in ops, ops
    assert len(record.syncs) == 4, record.syncs  # + the boolean index's backward index_put
    assert record.by(2)["t"] == 0 and record.by(2)["add"] >= 1
    assert record.launches("optimizer") > 0 and record.launches("backward") > 0


@pytest.mark.parametrize("optimizer", ["lamb", "adamw"])
def test_the_pretraining_step_does_not_sync_on_the_cuda_path(optimizer):
    """`folnet pretrain`'s step -- forward, the MLM gather at static shapes, loss, backward,
    gradient norm, the guard's judgement, the optimiser (skipping on the device) -- makes no
    host sync where a CUDA device would run it."""
    record = sc.census(sc.folnet_step("tiny", path="cuda", optimizer=optimizer))
    assert record.syncs == [], record.syncs
    assert record.launches("forward") > 0 and record.launches("optimizer") > 0


def test_lamb_alone_is_a_few_dozen_launches():
    record = sc.optimizer_census("small", "lamb", path="cuda")
    assert record.launches() <= 40 and record.syncs == []


def test_the_floor_counts_each_value_once_per_phase_and_no_copy():
    """The floor by hand: x (n float32) read by two ops counts once; a permuted copy's write and
    its later read do not count; what a zero fill holds becomes a value when an op adds into
    it; the backward's reads and writes are their own phase's."""
    n = 64 * 32
    w = torch.nn.Parameter(torch.randn(64, 32) + 0.5)
    opt = torch.optim.SGD([w], lr=0.1)
    host: dict[str, float] = {}

    def run() -> None:
        a = w * 2.0  # read w (n), write a (n)
        b = w + 1.0  # read w again: no new floor; write b (n)
        c = a.t().contiguous()  # a copy: its write is no value
        d = c.sum()  # read c: a copy of a, read where a was made... not at all
        z = torch.zeros(64, 32)  # a fill
        z.add_(b)  # read z, read b, write z: z now holds values
        loss = (z * d).sum()  # read z, d
        host["forward"] = 1.0
        loss.backward()
        opt.step()
        opt.zero_grad()

    record = sc.census(sc.Step(torch.nn.Module(), opt, lambda name: None, run))
    size = 4 * n  # bytes of one (64, 32) float32
    # reads: w once (two ops), a (by the copy), b, z once it holds values, z * d, d; not c
    # (a copy) nor z while it holds the fill. Writes: a, b, z (by add_), z * d; d and loss
    # (4 bytes each); not c, not the fill. Autograd's seed of the backward pass, ones_like(loss),
    # runs before it: a fill (no value written) that reads loss (4 bytes)
    assert record.floor("forward") == 5 * size + 4 + 4 * size + 8 + 4
    # every op's operands and results: w twice, the copy's read and write, c's read, the fill
    assert record.moved(phase="forward") == 14 * size + 20
    assert record.floor("backward") > 0 and record.floor("optimizer") > 0
