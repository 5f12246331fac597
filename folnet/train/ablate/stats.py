"""Spread over seeds and questions, and which differences between ablation rows are real.

A row run with several seeds gives, per seed, a list of right/wrong answers on the same test
questions. Two sources of noise move its accuracy: the seed (initialisation, data order,
dropout) and the finite set of questions. `accuracy_spread` reports the mean over seeds, the
seed-to-seed standard deviation, and a percentile interval from a two-level bootstrap: draw the
seeds with replacement, then for each drawn seed its questions with replacement. The second
level needs no loop: the accuracy of Q questions drawn with replacement from a seed whose
accuracy is p is distributed as Binomial(Q, p) / Q, so it is sampled exactly in one call.

`difference_interval` bootstraps the difference of two rows' mean accuracies the same way (the
rows resampled independently); `differs` calls a difference real when that interval excludes
zero. With one seed per row only the question level remains, which the report then says.

`paired_difference_interval` is the interval for two arms of the same runs -- a row pretrained
and from scratch, seed for seed, on the same questions: the seeds are drawn once for both
arms, and within a drawn seed its questions once for both. Each question is then right in the
first arm only, in the second only, or alike, and the difference over Q questions drawn with
replacement is (M+ - M-) / Q with (M+, M-, M0) ~ Multinomial(Q, their shares): sampled exactly
in one call, as the binomial above. Pairing removes what the arms share (initial weights,
finetuning order, hard questions) from the spread of the difference.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from folnet.errors import FolnetError

__all__ = ["Spread", "accuracy_spread", "difference_interval", "differs", "excludes_zero",
           "paired_difference_interval", "seed_spread"]

#: Bootstrap draws: the 2.5% and 97.5% percentiles of 4,000 draws move by well under a point.
DRAWS = 4000


@dataclass(frozen=True)
class Spread:
    """Mean over seeds, the seed-to-seed standard deviation (0 with one seed), a percentile
    interval at `level`, and how many seeds made it."""

    mean: float
    std: float
    low: float
    high: float
    seeds: int
    level: float = 0.95

    def to_dict(self) -> dict[str, float | int]:
        return {"mean": self.mean, "std": self.std, "low": self.low, "high": self.high,
                "seeds": self.seeds, "level": self.level}


def _per_seed(hits: Sequence[Sequence[bool]], what: str) -> tuple[np.ndarray, np.ndarray]:
    """(accuracy per seed, questions per seed) of a row's answers; every seed needs answers."""
    if len(hits) == 0:
        raise FolnetError(f"{what}: no seed to summarise")
    counts = np.array([len(h) for h in hits], dtype=np.int64)
    if (counts == 0).any():
        raise FolnetError(f"{what}: seed {int(np.argmin(counts))} answered no question")
    accuracy = np.array([float(np.mean(np.asarray(h, dtype=bool))) for h in hits])
    return accuracy, counts


def _draws(accuracy: np.ndarray, counts: np.ndarray, draws: int,
           rng: np.random.Generator) -> np.ndarray:
    """[draws] bootstrap replicates of the mean accuracy over seeds."""
    seeds = rng.integers(0, len(accuracy), size=(draws, len(accuracy)))  # [draws, S]
    correct = rng.binomial(counts[seeds], accuracy[seeds])  # [draws, S]
    return (correct / counts[seeds]).mean(axis=1)  # [draws]


def _check_level(level: float) -> None:
    if not 0.0 < level < 1.0:
        raise FolnetError(f"level must lie in (0, 1), got {level!r}")


def accuracy_spread(hits: Sequence[Sequence[bool]], *, level: float = 0.95,
                    draws: int = DRAWS, seed: int = 0, what: str = "row") -> Spread:
    """Mean, seed std and bootstrap interval of a row's accuracy; ``hits[s][q]`` says whether
    seed ``s`` answered question ``q`` right."""
    _check_level(level)
    accuracy, counts = _per_seed(hits, what)
    replicates = _draws(accuracy, counts, draws, np.random.default_rng(seed))
    tail = (1.0 - level) / 2 * 100
    low, high = np.percentile(replicates, [tail, 100 - tail])
    std = float(accuracy.std(ddof=1)) if len(accuracy) > 1 else 0.0
    return Spread(float(accuracy.mean()), std, float(low), float(high), len(accuracy), level)


def seed_spread(values: Sequence[float], *, level: float = 0.95, draws: int = DRAWS,
                seed: int = 0) -> Spread:
    """Mean, std and a bootstrap-over-seeds interval of a per-seed number that is not an
    accuracy over questions (a loss, tokens per second)."""
    _check_level(level)
    array = np.asarray(values, dtype=np.float64)
    if array.size == 0:
        raise FolnetError("seed_spread: no value to summarise")
    rng = np.random.default_rng(seed)
    replicates = array[rng.integers(0, array.size, size=(draws, array.size))].mean(axis=1)
    tail = (1.0 - level) / 2 * 100
    low, high = np.percentile(replicates, [tail, 100 - tail])
    std = float(array.std(ddof=1)) if array.size > 1 else 0.0
    return Spread(float(array.mean()), std, float(low), float(high), int(array.size), level)


def difference_interval(a: Sequence[Sequence[bool]], b: Sequence[Sequence[bool]], *,
                        level: float = 0.95, draws: int = DRAWS,
                        seed: int = 0) -> tuple[float, float]:
    """Percentile interval of mean accuracy(a) - mean accuracy(b), both rows resampled
    independently over seeds and questions."""
    _check_level(level)
    rng = np.random.default_rng(seed)
    diff = _draws(*_per_seed(a, "row a"), draws, rng) - _draws(*_per_seed(b, "row b"), draws, rng)
    tail = (1.0 - level) / 2 * 100
    low, high = np.percentile(diff, [tail, 100 - tail])
    return float(low), float(high)


def excludes_zero(low: float, high: float) -> bool:
    """Whether an interval of a difference lies wholly on one side of 0: the difference is
    beyond the spread, a finding."""
    return low > 0.0 or high < 0.0


def differs(a: Sequence[Sequence[bool]], b: Sequence[Sequence[bool]], *,
            level: float = 0.95, draws: int = DRAWS, seed: int = 0) -> bool:
    """Whether the two rows' accuracies differ beyond their spread: the `level` interval of
    their difference excludes zero."""
    return excludes_zero(*difference_interval(a, b, level=level, draws=draws, seed=seed))


def paired_difference_interval(a: Sequence[Sequence[bool]], b: Sequence[Sequence[bool]], *,
                               level: float = 0.95, draws: int = DRAWS,
                               seed: int = 0) -> tuple[float, float]:
    """Percentile interval of mean accuracy(a) - mean accuracy(b) when ``a[s][q]`` and
    ``b[s][q]`` are the same seed's answers to the same question: seeds and, within each,
    questions resampled once for both (see the module docstring)."""
    _check_level(level)
    if len(a) != len(b):
        raise FolnetError(f"paired arms need the same seeds: {len(a)} and {len(b)} given")
    _, counts = _per_seed(a, "arm a")
    _, counts_b = _per_seed(b, "arm b")
    if (counts != counts_b).any():
        s = int(np.argmax(counts != counts_b))
        raise FolnetError(f"seed {s}: {counts[s]} and {counts_b[s]} answers; paired arms "
                          f"answer the same questions")
    pairs = [(np.asarray(x, dtype=bool), np.asarray(y, dtype=bool)) for x, y in zip(a, b,
                                                                                   strict=True)]
    plus = np.array([np.sum(x & ~y) for x, y in pairs]) / counts  # right in a only
    minus = np.array([np.sum(~x & y) for x, y in pairs]) / counts  # right in b only
    rng = np.random.default_rng(seed)
    seeds = rng.integers(0, len(counts), size=(draws, len(counts)))  # [draws, S]
    shares = np.stack([plus[seeds], minus[seeds]], axis=-1)  # [draws, S, 2]
    shares = np.concatenate([shares, np.clip(1.0 - shares.sum(-1, keepdims=True), 0.0, 1.0)],
                            axis=-1)  # [draws, S, 3]: a only, b only, alike
    drawn = rng.multinomial(counts[seeds], shares)  # [draws, S, 3]
    diff = ((drawn[..., 0] - drawn[..., 1]) / counts[seeds]).mean(axis=1)  # [draws]
    tail = (1.0 - level) / 2 * 100
    low, high = np.percentile(diff, [tail, 100 - tail])
    return float(low), float(high)
