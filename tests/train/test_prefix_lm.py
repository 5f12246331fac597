"""The decoder's PrefixLM pretraining (`folnet.train.data.prefix_rows`, ``--objective prefix``):
a document per row, each row's prefix drawn once from its index, the loss over the tokens after
the prefix against a loop over the model's logits, and a prefix that reads both ways."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import folnet
from folnet.train.data.packing import pack_documents
from folnet.train.data.prefix_rows import PrefixDataset, prefix_length
from folnet.train.pretrain.objectives import NextTokenForward, token_targets

END, PAD = 3, 0


def test_a_document_per_row_a_long_one_continued():
    rows = list(pack_documents([[7, 8], [9] * 6, [10]], 4, END, pad=PAD, alone=True))
    ids = [r[0].tolist() for r in rows]
    assert ids == [[7, 8, END, PAD], [9, 9, 9, 9], [9, 9, END, PAD], [10, END, PAD, PAD]]
    assert [r[2] for r in rows] == [3, 4, 3, 2]
    assert rows[0][1].tolist() == [0, 0, 0, -1]
    packed = list(pack_documents([[7, 8], [9] * 6, [10]], 4, END, pad=PAD))  # the clm rows
    assert packed[0][0].tolist() == [7, 8, END, 9]


def test_each_rows_prefix_is_drawn_once_from_its_index():
    draws = [prefix_length(5, i, 20) for i in range(200)]
    assert draws == [prefix_length(5, i, 20) for i in range(200)]  # the same every time
    assert min(draws) == 1 and max(draws) == 19  # uniform over 1 .. real - 1
    assert draws != [prefix_length(6, i, 20) for i in range(200)]  # the seed matters
    assert prefix_length(0, 3, 2) == 1

    class Rows:
        cache_status, num_documents = "built", 2

        def __len__(self):
            return 2

        def __getitem__(self, index):
            mask = torch.tensor([1, 1, 1, 1, 1, 0])
            return {"input_ids": torch.arange(6), "attention_mask": mask,
                    "document_ids": torch.tensor([0, 0, 0, 0, 0, -1])}

    data = PrefixDataset(Rows(), seed=5)
    assert int(data[1]["prefix_lengths"]) == prefix_length(5, 1, 5)
    assert int(data[-1]["prefix_lengths"]) == int(data[1]["prefix_lengths"])


@pytest.fixture(scope="module")
def decoder():
    torch.manual_seed(0)
    return folnet.build_model("j.a", preset="tiny", kind="decoder", vocab_size=40,
                              dropout=0.0).eval()


def test_the_loss_counts_the_tokens_after_the_prefix(decoder):
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(5, 40, (3, 10), generator=g)
    mask = torch.ones(3, 10, dtype=torch.long)
    mask[2, 7:] = 0
    ids[2, 7:] = PAD
    docs = torch.where(mask.bool(), 0, -1)
    prefix = torch.tensor([1, 4, 6])
    with torch.no_grad():
        loss_sum, _, correct, _, targets = NextTokenForward(decoder)(ids, docs, mask, prefix)
    with torch.no_grad():
        logits = decoder(ids, prefix_lengths=prefix, attention_mask=mask).logits.double()
    want, count, right = 0.0, 0, 0
    for b in range(3):
        for j in range(int(prefix[b]), int(mask[b].sum())):  # token j, from position j - 1
            want -= float(F.log_softmax(logits[b, j - 1], -1)[ids[b, j]])
            count += 1
            right += int(logits[b, j - 1].argmax() == ids[b, j])
    assert int(targets) == count == 9 + 6 + 1 and int(correct) == right
    assert float(loss_sum) == pytest.approx(want, rel=1e-5)
    batch = {"input_ids": ids, "document_ids": docs, "attention_mask": mask,
             "prefix_lengths": prefix}
    assert token_targets("decoder", [batch]) == count


def test_the_prefix_reads_both_ways_and_the_rest_does_not(decoder):
    ids = torch.randint(5, 40, (1, 10), generator=torch.Generator().manual_seed(2))
    prefix = torch.tensor([5])

    @torch.no_grad()
    def logits(x):
        return decoder(x, prefix_lengths=prefix).logits

    base = logits(ids)
    in_prefix = ids.clone()
    in_prefix[0, 4] = (ids[0, 4] + 1 - 5) % 35 + 5  # the prefix's last token
    assert not torch.allclose(logits(in_prefix)[0, 0], base[0, 0])  # seen from its start
    later = ids.clone()
    later[0, 7] = (ids[0, 7] + 1 - 5) % 35 + 5  # a target token
    changed = logits(later)
    assert torch.equal(changed[0, :7], base[0, :7])  # nothing before it sees it
    assert not torch.allclose(changed[0, 7], base[0, 7])
    assert np.isfinite(base.numpy()).all()
