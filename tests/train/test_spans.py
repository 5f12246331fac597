"""Span corruption (`folnet.train.data.spans`) against hand-written references: a worked
example, a second construction of input and target from the mask (by runs), and the mask's
counts and distribution over seeds."""

from __future__ import annotations

import itertools
import random
import statistics

import pytest
import torch

from folnet.errors import FolnetError
from folnet.train.data.spans import corrupt, corrupted_lengths, noise_mask, span_counts

S = [900, 901, 902, 903, 904, 905, 906, 907]  # sentinel ids
END = 1


def test_the_worked_example():
    tokens = list(range(10, 20))
    mask = [False, False, True, True, False, False, False, True, False, False]
    inputs, targets = corrupt(tokens, mask, S, END)
    assert inputs == [10, 11, 900, 14, 15, 16, 901, 18, 19, END]
    assert targets == [900, 12, 13, 901, 17, END]


def _by_runs(tokens, mask):
    """The reference: input and target from the mask's runs (itertools.groupby)."""
    inputs, targets, k = [], [], 0
    at = 0
    for noisy, run in itertools.groupby(mask):
        n = len(list(run))
        piece = tokens[at : at + n]
        at += n
        if noisy:
            inputs.append(S[k])
            targets += [S[k], *piece]
            k += 1
        else:
            inputs += piece
    return [*inputs, END], [*targets, END]


@pytest.mark.parametrize(("n", "rate", "mean"), [(20, 0.15, 3.0), (37, 0.3, 2.0), (9, 0.5, 1.0),
                                                 (64, 0.15, 3.0)])
def test_seeded_corruption_matches_the_reference_and_its_counts(n, rate, mean):
    tokens = [100 + i for i in range(n)]
    noise, spans = span_counts(n, rate, mean)
    assert noise == min(max(round(n * rate), 1), n - 1) and spans >= 1
    for seed in range(20):
        mask = noise_mask(n, rate, mean, random.Random(seed))
        assert mask == noise_mask(n, rate, mean, random.Random(seed))  # the seed repeats it
        assert len(mask) == n and sum(mask) == noise and not mask[0]
        assert sum(1 for k, _ in itertools.groupby(mask) if k) == spans
        inputs, targets = corrupt(tokens, mask, S, END)
        assert (inputs, targets) == _by_runs(tokens, mask)
        assert (len(inputs), len(targets)) == corrupted_lengths(n, rate, mean)


def test_the_mean_span_length_and_every_layout_is_drawn():
    lengths = []
    for seed in range(400):
        mask = noise_mask(100, 0.15, 3.0, random.Random(seed))
        lengths += [len(list(run)) for k, run in itertools.groupby(mask) if k]
    assert abs(statistics.mean(lengths) - 3.0) < 1e-9  # 15 noise tokens in 5 spans, always
    assert len(set(lengths)) >= 5  # the spans' lengths vary
    # 7 tokens, 2 noise in 2 spans of 1: the kept 5 cut into 2 runs (1+4, 2+3, 3+2, 4+1),
    # each of the 4 layouts drawn about equally often
    seen = [tuple(noise_mask(7, 2 / 7, 1.0, random.Random(s))) for s in range(4000)]
    counts = {layout: seen.count(layout) for layout in set(seen)}
    assert len(counts) == 4 and all(layout[-1] for layout in counts)  # a span ends each
    assert max(counts.values()) < 1.15 * min(counts.values())


def test_bad_options_are_refused_by_name():
    with pytest.raises(FolnetError, match=r"noise rate must lie in \(0, 1\), got 1.5"):
        span_counts(10, 1.5, 3.0)
    with pytest.raises(FolnetError, match=r"mean span length must be >= 1, got 0\.5"):
        span_counts(10, 0.15, 0.5)
    with pytest.raises(FolnetError, match="needs at least 2 tokens, got 1"):
        span_counts(1, 0.15, 3.0)
    with pytest.raises(FolnetError, match="more spans than the 1 sentinel tokens"):
        corrupt([1, 2, 3, 4], [False, True, False, True], [900], END)
    with pytest.raises(FolnetError, match="4 tokens but a mask of 3"):
        corrupt([1, 2, 3, 4], [False, True, False], S, END)


def _uncorrupt(inputs, targets, sentinels):
    """The row back from its input and target: each sentinel replaced by the span after it
    in the target (the reference: a walk over both lists)."""
    spans, current = {}, None
    for t in targets[:-1]:
        if t in sentinels:
            current = t
            spans[current] = []
        else:
            spans[current].append(t)
    row = []
    for t in inputs[:-1]:
        row += spans[t] if t in sentinels else [t]
    return row


def test_span_rows_corrupt_packed_rows_the_same_way_every_time(tmp_path):
    from folnet.train.data.config import PretrainDataConfig
    from folnet.train.data.corpus import build_packed_dataset
    from folnet.train.data.kinship import pretraining_documents
    from folnet.train.data.span_rows import SENTINELS, build_span_dataset, raw_length
    from folnet.train.data.tokenizer import train_tokenizer

    texts = [s for d in pretraining_documents(30, seed=0) for s in d]
    plain = train_tokenizer(texts=texts, vocab_size=200)
    with pytest.raises(FolnetError, match="span corruption needs 100 sentinel tokens"):
        build_span_dataset("kinship", plain, PretrainDataConfig(
            seq_len=32, objective="span", kinship_documents=30, cache_dir=str(tmp_path / "c")))
    tok = plain.with_sentinels(SENTINELS)
    assert tok.vocab_size == plain.vocab_size + SENTINELS
    assert tok.sentinel_ids == list(range(plain.vocab_size, plain.vocab_size + SENTINELS))
    assert tok.with_sentinels(SENTINELS) is tok and plain.sentinel_ids == []
    config = PretrainDataConfig(seq_len=32, objective="span", kinship_documents=30,
                                cache_dir=str(tmp_path / "cache"))
    data = build_span_dataset("kinship", tok, config)
    raw = raw_length(32, 0.15, 3.0)
    rows = build_packed_dataset("kinship", tok, PretrainDataConfig(
        seq_len=raw, objective="span", kinship_documents=30, cache_dir=str(tmp_path / "cache")))
    assert len(data) == len(rows) > 3
    sentinels = set(tok.sentinel_ids)
    for i in (0, 1, len(data) - 2):  # full rows
        item = data[i]
        assert item["attention_mask"].all() and item["input_ids"].shape == (32,)
        inputs = item["input_ids"].tolist()
        targets = [t for t in item["labels"].tolist() if t != -100]
        assert inputs[-1] == targets[-1] == tok.sep_id
        assert any(t in sentinels for t in inputs)
        assert _uncorrupt(inputs, targets, sentinels) == rows[i]["input_ids"].tolist()
        again = data[i]
        assert all(torch.equal(item[k], again[k]) for k in item)  # seeded by the row
    assert data[0]["input_ids"].tolist() != data[1]["input_ids"].tolist()
