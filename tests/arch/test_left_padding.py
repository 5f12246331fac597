"""Left padding is neutral in decoders and in generation: positions count from each row's first
real token, so a left-padded batch gives every row the logits and tokens it gets alone (the
old code gave 8.9e-3 (rpe) and 0.64 (ape) logit differences and other greedy tokens)."""

from __future__ import annotations

import pytest
import torch
from tolerances import assert_close, assert_tokens_lead

import folnet

pytestmark = [pytest.mark.numerics, pytest.mark.usefixtures("one_thread")]

V, PAD = 60, 0
#: Logits of a row in a padded batch against the row alone (weights scaled up, logits up to
#: ~10): measured up to 5.8e-6 apart on two kernel sets; 1e-4 leaves 17x, against the 8.9e-3
#: (rpe) and 0.64 (ape) that counting positions from the pads gave.
ATOL = 1e-4


def model(position: str, ops: str = "jmc.atp"):
    torch.manual_seed(3)
    m = folnet.build_model(ops, preset="tiny", kind="decoder", vocab_size=V, dropout=0.0,
                           position=position).eval()
    g = torch.Generator().manual_seed(4)
    with torch.no_grad():  # weights far from the init, so positions matter
        for p in m.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    return m


def prompts():
    g = torch.Generator().manual_seed(5)
    return [torch.randint(1, V, (n,), generator=g) for n in (7, 4, 2)]


def left_padded(rows: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    T = max(len(r) for r in rows)
    ids = torch.full((len(rows), T), PAD, dtype=torch.long)
    mask = torch.zeros(len(rows), T, dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, T - len(r):] = r
        mask[i, T - len(r):] = 1
    return ids, mask


@pytest.mark.parametrize("position", ["rpe", "ape", "ape+rpe"])
def test_left_padded_batch_gives_each_rows_own_logits(position):
    m, rows = model(position), prompts()
    ids, mask = left_padded(rows)
    T = ids.shape[1]
    with torch.no_grad():
        batch = m(ids, attention_mask=mask).logits
        for i, r in enumerate(rows):
            alone = m(r[None]).logits[0]  # (n, V)
            got = batch[i, T - len(r):]
            assert_close(got, alone, rtol=0, atol=ATOL, what=f"{position} row {i}")
            assert alone.abs().max() > 1.0  # the logits are far from zero


@pytest.mark.parametrize("position", ["rpe", "ape"])
def test_left_padded_prefix_lm_counts_the_prefix_from_the_first_real_token(position):
    m, rows = model(position), prompts()
    ids, mask = left_padded(rows)
    T = ids.shape[1]
    prefix = torch.tensor([3, 2, 1])
    with torch.no_grad():
        batch = m(ids, attention_mask=mask, prefix_lengths=prefix)
        for i, r in enumerate(rows):
            alone = m(r[None], prefix_lengths=prefix[i : i + 1])
            assert_close(batch.logits[i, T - len(r):], alone.logits[0], rtol=0, atol=ATOL,
                         what=f"{position} prefix row {i}")
        labels = ids.masked_fill(mask == 0, -100)
        loss = m(ids, attention_mask=mask, prefix_lengths=prefix, labels=labels).loss
        # the same targets as the rows alone: after the prefix, within each row
        parts = [m(r[None], prefix_lengths=prefix[i : i + 1], labels=r[None]).logits[0]
                 for i, r in enumerate(rows)]
        targets = [(p[prefix[i] - 1 : -1], r[prefix[i]:]) for i, (p, r) in
                   enumerate(zip(parts, rows, strict=True))]
        want = torch.nn.functional.cross_entropy(torch.cat([t[0] for t in targets]),
                                                 torch.cat([t[1] for t in targets]))
        assert_close(loss, want, rtol=1e-5, atol=1e-5, what=f"{position} prefix loss")


@pytest.mark.parametrize("position", ["rpe", "ape"])
@pytest.mark.parametrize("use_cache", [True, False])
def test_left_padded_generation_gives_each_rows_own_tokens(position, use_cache):
    m, rows = model(position), prompts()
    ids, mask = left_padded(rows)
    out = m.generate(ids, 6, attention_mask=mask, use_cache=use_cache, return_logits=True)
    for i, r in enumerate(rows):
        alone = m.generate(r[None], 6, use_cache=use_cache, return_logits=True)
        assert_tokens_lead(out.logits[i : i + 1], alone.sequences[:, len(r):],
                           f"{position} generated row {i}", gap=10 * ATOL)
        assert torch.equal(out.sequences[i, ids.shape[1]:], alone.sequences[0, len(r):])
        assert_close(out.logits[i], alone.logits[0], rtol=0, atol=ATOL,
                     what=f"{position} generated row {i} logits")
