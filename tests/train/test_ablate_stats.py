"""Seed and question spread of ablation rows, and the rule that marks a difference as real."""

from __future__ import annotations

import numpy as np
import pytest

from folnet.errors import FolnetError
from folnet.train.ablate.stats import accuracy_spread, difference_interval, differs, seed_spread


def answers(rates: list[float], questions: int, seed: int) -> list[list[bool]]:
    rng = np.random.default_rng(seed)
    return [list(rng.random(questions) < p) for p in rates]


def test_mean_and_std_are_over_seeds():
    hits = [[True, True, False, False], [True, True, True, False], [True, False, False, False]]
    spread = accuracy_spread(hits)
    per_seed = [0.5, 0.75, 0.25]
    assert spread.mean == pytest.approx(np.mean(per_seed))
    assert spread.std == pytest.approx(np.std(per_seed, ddof=1))
    assert spread.seeds == 3 and spread.low <= spread.mean <= spread.high


def test_interval_matches_a_loop_bootstrap():
    """The binomial shortcut for the question level against resampling questions one by one."""
    hits = answers([0.6, 0.7, 0.65], 300, seed=1)
    fast = accuracy_spread(hits, draws=4000, seed=3)
    rng = np.random.default_rng(7)
    replicates = []
    for _ in range(2000):
        drawn = [hits[s] for s in rng.integers(0, 3, size=3)]
        replicates.append(np.mean([np.mean(rng.choice(h, size=len(h))) for h in drawn]))
    low, high = np.percentile(replicates, [2.5, 97.5])
    assert fast.low == pytest.approx(low, abs=0.01) and fast.high == pytest.approx(high, abs=0.01)


def test_one_seed_has_only_the_question_level():
    hits = answers([0.5], 400, seed=2)
    spread = accuracy_spread(hits)
    assert spread.std == 0.0
    # binomial standard error sqrt(.25 / 400) = 0.025: the 95% interval is about +-0.049
    assert spread.high - spread.low == pytest.approx(2 * 1.96 * 0.025, rel=0.15)


def test_far_apart_rows_differ_and_close_rows_do_not():
    strong = answers([0.92, 0.90, 0.93], 400, seed=4)
    weak = answers([0.60, 0.63, 0.58], 400, seed=5)
    twin = answers([0.91, 0.93, 0.90], 400, seed=6)
    assert differs(strong, weak) and differs(weak, strong)
    low, high = difference_interval(strong, weak)
    gap = accuracy_spread(strong).mean - accuracy_spread(weak).mean  # about 0.31
    assert 0.15 < low < gap < high < 0.45
    assert not differs(strong, twin)
    low, high = difference_interval(strong, twin)
    assert low < 0 < high


def test_seed_noise_alone_can_hide_a_gap():
    """Many questions but seeds all over the place: the seed level keeps the call honest."""
    noisy = answers([0.50, 0.80, 0.65], 2000, seed=8)
    steady = answers([0.70, 0.71, 0.69], 2000, seed=9)
    assert not differs(noisy, steady)


def test_seed_spread_of_plain_numbers():
    spread = seed_spread([2.0, 2.2, 1.8])
    assert spread.mean == pytest.approx(2.0) and spread.std == pytest.approx(0.2)
    assert 1.8 <= spread.low <= spread.mean <= spread.high <= 2.2


@pytest.mark.parametrize(("call", "message"), [
    (lambda: accuracy_spread([]), "no seed to summarise"),
    (lambda: accuracy_spread([[True], []]), "seed 1 answered no question"),
    (lambda: accuracy_spread([[True]], level=1.0), r"level must lie in \(0, 1\), got 1.0"),
    (lambda: seed_spread([]), "no value to summarise"),
])
def test_errors(call, message):
    with pytest.raises(FolnetError, match=message):
        call()
