"""Packed decoder rows (`folnet.train.data.packing`, `folnet.arch.packed`): the rows' layout, and
a piece of a row computing what it would alone -- no attention, no binary pair and no target
across a document boundary."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import folnet
from folnet.errors import FolnetError
from folnet.train.data.packing import pack_documents

V = 61


def test_documents_are_laid_end_to_end_and_cut_into_full_rows():
    rows = list(pack_documents([[1, 2, 3], [], [4, 5], [6, 7, 8, 9, 10]], 4, end=99, pad=0))
    ids = [r[0].tolist() for r in rows]
    docs = [r[1].tolist() for r in rows]
    assert ids == [[1, 2, 3, 99], [4, 5, 99, 6], [7, 8, 9, 10], [99, 0, 0, 0]]
    assert docs == [[0, 0, 0, 0], [0, 0, 0, 1], [0, 0, 0, 0], [0, -1, -1, -1]]
    assert [r[2] for r in rows] == [4, 4, 4, 1]
    with pytest.raises(FolnetError, match="seq_len must be an integer >= 2, got 1"):
        next(pack_documents([[1]], 1, end=2))


def _decoder():
    torch.manual_seed(0)
    return folnet.build_model("jmc.atp", preset="tiny", kind="decoder", vocab_size=V,
                              dropout=0.0).eval()


def _row(first: list[int], second: list[int]):
    ids = torch.tensor([first + second])
    docs = torch.tensor([[0] * len(first) + [1] * len(second)])
    return ids, docs


def _piece_loss(logits: torch.Tensor, ids: torch.Tensor, lo: int, hi: int) -> torch.Tensor:
    """Next-token loss of positions lo..hi-2 predicting lo+1..hi-1 (one piece's own)."""
    return F.cross_entropy(logits[0, lo : hi - 1], ids[0, lo + 1 : hi], reduction="sum")


@pytest.mark.parametrize("changed", ["first", "second"])
def test_a_piece_ignores_the_other_documents_of_its_row(changed):
    """Changing one document's tokens changes nothing of another's logits and loss; a piece
    gives the logits of its document run alone."""
    model = _decoder()
    g = torch.Generator().manual_seed(1)
    a, b = torch.randint(5, V, (7,), generator=g).tolist(), torch.randint(5, V, (6,),
                                                                          generator=g).tolist()
    other = torch.randint(5, V, (7 if changed == "first" else 6,), generator=g).tolist()
    ids, docs = _row(a, b)
    ids2, _ = _row(other, b) if changed == "first" else _row(a, other)
    with torch.no_grad():
        one = model(ids, document_ids=docs).logits
        two = model(ids2, document_ids=docs).logits
        alone = [model(torch.tensor([a])).logits, model(torch.tensor([b])).logits]
    kept = slice(7, 13) if changed == "first" else slice(0, 7)
    torch.testing.assert_close(two[:, kept], one[:, kept], rtol=1e-5, atol=1e-6)
    lo, hi = (kept.start, kept.stop)
    torch.testing.assert_close(_piece_loss(two, ids2, lo, hi), _piece_loss(one, ids, lo, hi),
                               rtol=1e-6, atol=1e-6)
    changed_part = slice(0, 7) if changed == "first" else slice(7, 13)
    assert (two[:, changed_part] - one[:, changed_part]).abs().max() > 1e-3  # not vacuous
    torch.testing.assert_close(one[:, :7], alone[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(one[:, 7:], alone[1], rtol=1e-5, atol=1e-5)


def test_the_loss_predicts_no_token_across_a_boundary():
    model = _decoder()
    g = torch.Generator().manual_seed(2)
    ids = torch.randint(5, V, (2, 12), generator=g)
    docs = torch.tensor([[0] * 5 + [1] * 4 + [2] * 3, [0] * 12])
    with torch.no_grad():
        out = model(ids, labels=ids, document_ids=docs)
    logits = out.logits
    pieces = [[(0, 5), (5, 9), (9, 12)], [(0, 12)]]
    total = sum(_piece_loss(logits[r : r + 1], ids[r : r + 1], lo, hi)
                for r, spans in enumerate(pieces) for lo, hi in spans)
    count = sum(hi - lo - 1 for spans in pieces for lo, hi in spans)
    torch.testing.assert_close(out.loss, total / count, rtol=1e-6, atol=1e-6)


def test_no_gradient_crosses_a_boundary():
    """The second document's loss sends the first document's token rows of the (tied)
    embedding only what the LM head's softmax sends every row -- the same as when those
    tokens are not in the row at all."""
    model = _decoder().train()
    a, b = list(range(5, 12)), list(range(30, 36))
    emb = model.word_embedding().weight

    def grad_of_a_rows(first):
        model.zero_grad()
        ids, docs = _row(first, b)
        _piece_loss(model(ids, document_ids=docs).logits, ids, 7, 13).backward()
        return emb.grad[a].clone()

    with_a, without_a = grad_of_a_rows(a), grad_of_a_rows(list(range(40, 47)))
    assert with_a.abs().sum() > 0
    torch.testing.assert_close(with_a, without_a, rtol=1e-5, atol=1e-7)


def test_bad_document_ids_are_refused_by_name():
    model = _decoder()
    ids = torch.randint(5, V, (1, 6))
    with pytest.raises(FolnetError, match=r"document_ids must be an integer tensor, got "
                                          r"torch\.float32"):
        model(ids, document_ids=torch.zeros(1, 6))
    with pytest.raises(FolnetError, match=r"shape of input_ids \(1, 6\), got \(1, 5\)"):
        model(ids, document_ids=torch.zeros(1, 5, dtype=torch.long))
    with pytest.raises(FolnetError, match="document_ids and prefix_lengths"):
        model(ids, prefix_lengths=2, document_ids=torch.zeros(1, 6, dtype=torch.long))


def test_held_out_documents_are_a_seeded_share_and_the_two_parts_split_the_corpus(tmp_path):
    from folnet.train.data.config import PretrainDataConfig
    from folnet.train.data.corpus import build_packed_dataset
    from folnet.train.data.kinship import pretraining_documents
    from folnet.train.data.packing import heldout_documents
    from folnet.train.data.tokenizer import train_tokenizer

    held = heldout_documents(50, 0.1, seed=3)
    assert len(held) == 5 and held == heldout_documents(50, 0.1, seed=3)
    assert held != heldout_documents(50, 0.1, seed=4)
    assert heldout_documents(50, 0.0, 3) == frozenset() and len(heldout_documents(2, 0.4, 0)) == 1
    texts = [s for d in pretraining_documents(20, seed=0) for s in d]
    tok = train_tokenizer(texts=texts, vocab_size=200)

    def tokens(part: str, heldout: float) -> list[int]:
        config = PretrainDataConfig(seq_len=16, objective="clm", kinship_documents=20,
                                    heldout=heldout, cache_dir=str(tmp_path / "cache"))
        data = build_packed_dataset("kinship", tok, config, part=part)
        return [t for i in range(len(data)) for t, m in
                zip(data[i]["input_ids"].tolist(), data[i]["attention_mask"].tolist(),
                    strict=True) if m]

    whole, train, out = tokens("train", 0.0), tokens("train", 0.2), tokens("heldout", 0.2)
    assert out and len(train) + len(out) == len(whole)
    assert sorted(train + out) == sorted(whole)  # the same documents, split in two
