"""Span corruption (`folnet.train.data.spans`) against hand-written references: a worked
example, a second construction of input and target from the mask (by runs), and the mask's
counts and distribution over seeds."""

from __future__ import annotations

import itertools
import random
import statistics

import pytest

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
