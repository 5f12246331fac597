"""Dynamic MLM masking: statistics on real tokenised text, special tokens, caps, resumption."""

from __future__ import annotations

import pytest
import torch
from english import write_english_corpus
from torch.utils.data import DataLoader

from folnet.errors import FolnetError
from folnet.train.data.config import PretrainDataConfig
from folnet.train.data.corpus import build_pretraining_dataset
from folnet.train.data.masking import IGNORE_INDEX, PretrainingCollator, SpecialIds, mask_tokens
from folnet.train.data.tokenizer import train_tokenizer


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """A real-English NSP dataset: ~3000 sequences of stdlib docstring prose."""
    root = tmp_path_factory.mktemp("masking")
    corpus = write_english_corpus(root / "english.txt", max_bytes=1_500_000)
    tok = train_tokenizer([corpus], vocab_size=6000)
    dataset = build_pretraining_dataset(corpus, tok, PretrainDataConfig(seq_len=128, seed=3))
    assert len(dataset) >= 3000
    batch = PretrainingCollator(tok).collate([dataset[i] for i in range(3000)])
    return tok, batch


def _special_mask(ids: torch.Tensor, tok) -> torch.Tensor:
    return torch.isin(ids, torch.tensor(sorted(tok.special_ids)))


def test_statistics_on_real_text(setup):
    tok, batch = setup
    ids = batch["input_ids"]  # [3000, 128]
    gen = torch.Generator().manual_seed(11)
    masked, labels = mask_tokens(ids, tok, generator=gen, vocab_size=tok.vocab_size)
    chosen = labels != IGNORE_INDEX
    eligible = ~_special_mask(ids, tok)
    # never a special token or padding; labels are the original ids
    assert not (chosen & ~eligible).any()
    assert torch.equal(labels[chosen], ids[chosen])
    assert torch.equal(masked[~chosen], ids[~chosen])
    assert not (batch["attention_mask"] == 0)[chosen].any()
    # ~15% of eligible tokens (the 20-prediction cap rarely binds at seq_len 128)
    n_eligible = eligible.sum(1)
    per_row = chosen.sum(1)
    assert (per_row <= 20).all()
    assert (per_row >= torch.clamp(n_eligible, max=1)).all()
    rate = per_row.sum().item() / n_eligible.sum().item()
    assert abs(rate - 0.15) < 0.015, rate
    # 80% [MASK], 10% random ordinary token, 10% kept
    n = chosen.sum().item()
    as_mask = (masked[chosen] == tok.mask_id).float().sum().item() / n
    kept = (masked[chosen] == ids[chosen]).float().sum().item() / n
    randomised = 1.0 - as_mask - kept
    assert abs(as_mask - 0.8) < 0.03, as_mask
    assert abs(kept - 0.1) < 0.03, kept
    assert abs(randomised - 0.1) < 0.03, randomised
    replaced = masked[chosen & (masked != tok.mask_id) & (masked != ids)]
    assert replaced.numel() > 0 and not _special_mask(replaced, tok).any()
    assert replaced.unique().numel() > 100  # spread over the vocabulary, not one id


def test_max_predictions_and_minimum_one(setup):
    tok, batch = setup
    ids = batch["input_ids"][:500]
    gen = torch.Generator().manual_seed(0)
    _, labels = mask_tokens(
        ids, tok, mlm_probability=0.5, max_predictions=5, generator=gen, vocab_size=tok.vocab_size
    )
    per_row = (labels != IGNORE_INDEX).sum(1)
    n_eligible = (~_special_mask(ids, tok)).sum(1)
    assert (per_row <= 5).all() and (per_row >= 1).all()
    capped = n_eligible >= 10  # half of 10+ tokens is 5 or more: the cap decides
    assert capped.sum() > 100 and (per_row[capped] == 5).all()
    specials = SpecialIds.from_tokenizer(tok)
    short = torch.tensor([[2, 900, 3, 901, 3, 0, 0, 0], [2, 3, 3, 0, 0, 0, 0, 0]])
    _, labels = mask_tokens(short, specials, generator=gen, vocab_size=tok.vocab_size)
    assert (labels[0] != IGNORE_INDEX).sum() == 1  # 15% of 2 rounds to 0: at least one
    assert (labels[1] == IGNORE_INDEX).all()  # nothing eligible, nothing chosen


def test_deterministic_given_generator(setup):
    tok, batch = setup
    ids = batch["input_ids"][:64]
    before = ids.clone()

    def run(seed):
        gen = torch.Generator().manual_seed(seed)
        return mask_tokens(ids, tok, generator=gen, vocab_size=tok.vocab_size)

    a, b, c = run(5), run(5), run(6)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert not torch.equal(a[1], c[1])
    assert torch.equal(ids, before)  # input untouched


def test_collator_batch_and_dynamic_masks(setup):
    tok, batch = setup
    items = [{k: v[i] for k, v in batch.items()} for i in range(16)]
    collator = PretrainingCollator(tok, seed=1)
    first, second = collator(items), collator(items)
    assert set(first) == {
        "input_ids",
        "token_type_ids",
        "attention_mask",
        "nsp_labels",
        "mlm_labels",
    }
    assert first["input_ids"].shape == first["mlm_labels"].shape == (16, 128)
    assert first["nsp_labels"].shape == (16,) and first["nsp_labels"].dtype == torch.long
    assert first["attention_mask"].dtype == torch.bool
    assert torch.equal(first["token_type_ids"], batch["token_type_ids"][:16])
    assert not torch.equal(first["mlm_labels"], second["mlm_labels"])  # a new mask each time
    split = PretrainingCollator(tok, seed=1)
    assert torch.equal(split.apply_mask(split.collate(items))["input_ids"], first["input_ids"])


def test_collator_resumes_exact_masks(setup):
    tok, batch = setup
    items = [{k: v[i] for k, v in batch.items()} for i in range(8)]
    run = PretrainingCollator(tok, seed=42)
    run(items)
    state = run.state_dict()
    expected = [run(items)["input_ids"] for _ in range(3)]
    resumed = PretrainingCollator(tok, seed=0)
    resumed.load_state_dict(state)
    got = [resumed(items)["input_ids"] for _ in range(3)]
    assert all(torch.equal(x, y) for x, y in zip(expected, got, strict=True))
    other = PretrainingCollator(tok, mlm_probability=0.2)
    with pytest.raises(FolnetError, match=r"mlm_probability=0\.15 but this collator has"):
        other.load_state_dict(state)
    with pytest.raises(FolnetError, match="lacks 'generator_state'"):
        other.load_state_dict({})


def test_with_dataloader(setup, tmp_path):
    tok, _ = setup
    corpus = tmp_path / "c.txt"
    corpus.write_text(
        "\n\n".join(f"Story {d} starts. It goes on. It ends here." for d in range(40)),
        encoding="utf-8",
    )
    dataset = build_pretraining_dataset(corpus, tok, PretrainDataConfig(seq_len=32))
    collator = PretrainingCollator.from_config(tok, PretrainDataConfig(max_predictions=3))
    loader = DataLoader(dataset, batch_size=8, shuffle=True, collate_fn=collator)
    out = next(iter(loader))
    assert out["input_ids"].shape == (8, 32)
    assert ((out["mlm_labels"] != IGNORE_INDEX).sum(1) <= 3).all()


def test_errors(setup):
    tok, batch = setup
    gen = torch.Generator()
    ids = batch["input_ids"][:4]
    with pytest.raises(FolnetError, match=r"2-D LongTensor \[B, T\]"):
        mask_tokens(ids[0], tok, generator=gen, vocab_size=tok.vocab_size)
    with pytest.raises(FolnetError, match=r"2-D LongTensor"):
        mask_tokens(ids.float(), tok, generator=gen, vocab_size=tok.vocab_size)
    for p in (0.0, 1.0, 1.5):
        with pytest.raises(FolnetError, match=r"mlm_probability must lie in \(0, 1\)"):
            mask_tokens(ids, tok, mlm_probability=p, generator=gen, vocab_size=tok.vocab_size)
    with pytest.raises(FolnetError, match="max_predictions must be >= 1"):
        mask_tokens(ids, tok, max_predictions=0, generator=gen, vocab_size=tok.vocab_size)
    with pytest.raises(FolnetError, match="mask_replace_prob \\+ random_replace_prob"):
        mask_tokens(
            ids,
            tok,
            mask_replace_prob=0.9,
            random_replace_prob=0.2,
            generator=gen,
            vocab_size=tok.vocab_size,
        )
    with pytest.raises(FolnetError, match="vocab_size 4 is too small"):
        mask_tokens(ids, tok, generator=gen, vocab_size=4)
    with pytest.raises(FolnetError, match="expected a SpecialIds or a tokenizer"):
        mask_tokens(ids, object(), generator=gen, vocab_size=100)
    with pytest.raises(FolnetError, match="vocab_size is required"):
        PretrainingCollator(SpecialIds.from_tokenizer(tok))
    with pytest.raises(FolnetError, match="empty list of examples"):
        PretrainingCollator(tok)([])


def test_no_row_gets_more_targets_than_most_targets_says():
    """The static gather's slots per sequence (`most_targets`) bound what the masking picks:
    random rows of every length up to 80, with padding and specials, at three rates."""
    from folnet.train.data.masking import SpecialIds, mask_tokens, most_targets

    specials = SpecialIds(pad_id=0, unk_id=1, cls_id=2, sep_id=3, mask_id=4)
    g = torch.Generator().manual_seed(0)
    tight = 0
    for p in (0.15, 0.3, 0.5):
        for T in range(1, 81, 3):
            ids = torch.randint(5, 50, (64, T), generator=g)
            ids[:, 0] = 2
            ids[:40, T // 2:] = 0  # padded rows
            _, labels = mask_tokens(ids, specials, mlm_probability=p, max_predictions=20,
                                    generator=g, vocab_size=50)
            most = int((labels != -100).sum(1).max())
            bound = most_targets(T, p, 20)
            assert most <= bound, (T, p, most, bound)
            tight += most == bound
    assert tight > 20  # the bound is reached, not loose
