"""Span corruption, the encoder-decoder's denoising objective (the T5 family's): some spans of a
sequence's tokens are cut out, each replaced in the input by a sentinel token of its own, and
the target is the sentinels each followed by the span it stands for.

    tokens   a b c d e f g h i j          noise   . . x x . . . x . .
    input    a b <s0> e f g <s1> i j </s>
    target   <s0> c d <s1> h </s>

Which tokens are noise: ``round(n * rate)`` of them (at least one, at most n - 1) in
``round(noise / mean_span)`` spans (at least one), the noise tokens and the kept ones each cut
into that many runs of random positive lengths (every cut equally likely), and the runs laid
out kept, noise, kept, noise, ..., so that the spans' mean length is ``noise / spans`` (about
``mean_span``), the sequence starts with kept tokens and a span ends it. The draw takes a
`random.Random`, so a seeded run corrupts the same way again.

The lengths that come out are fixed by the input's: an input of n tokens and s spans gives
``n - noise + s + 1`` input tokens and ``noise + s + 1`` target tokens (the end token included),
which `corrupted_lengths` says before any draw -- the pretraining data sizes its rows with it.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from folnet.errors import FolnetError

__all__ = ["corrupt", "corrupted_lengths", "noise_mask", "span_counts"]


def _check(rate: float, mean_span: float) -> None:
    if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not 0.0 < rate < 1.0:
        raise FolnetError(f"span corruption: the noise rate must lie in (0, 1), got {rate!r}")
    if (isinstance(mean_span, bool) or not isinstance(mean_span, (int, float))
            or mean_span < 1.0):
        raise FolnetError(f"span corruption: the mean span length must be >= 1, got "
                          f"{mean_span!r}")


def span_counts(n: int, rate: float, mean_span: float) -> tuple[int, int]:
    """(noise tokens, spans) of a sequence of ``n`` >= 2 tokens."""
    _check(rate, mean_span)
    if n < 2:
        raise FolnetError(f"span corruption needs at least 2 tokens, got {n}")
    noise = min(max(round(n * rate), 1), n - 1)
    spans = min(max(round(noise / mean_span), 1), noise, n - noise)
    return noise, spans


def corrupted_lengths(n: int, rate: float, mean_span: float) -> tuple[int, int]:
    """The (input, target) lengths that ``n`` tokens corrupt into, end tokens included."""
    noise, spans = span_counts(n, rate, mean_span)
    return n - noise + spans + 1, noise + spans + 1


def _cut(total: int, parts: int, rng: random.Random) -> list[int]:
    """``total`` split into ``parts`` positive lengths, every split equally likely."""
    cuts = sorted(rng.sample(range(1, total), parts - 1))
    return [b - a for a, b in zip([0, *cuts], [*cuts, total], strict=True)]


def noise_mask(n: int, rate: float, mean_span: float, rng: random.Random) -> list[bool]:
    """Which of ``n`` tokens are noise (True), drawn as the module docstring says."""
    noise, spans = span_counts(n, rate, mean_span)
    noise_runs = _cut(noise, spans, rng)
    kept_runs = _cut(n - noise, spans, rng)
    mask: list[bool] = []
    for kept, cut in zip(kept_runs, noise_runs, strict=True):
        mask += [False] * kept + [True] * cut
    return mask


def corrupt(tokens: Sequence[int], mask: Sequence[bool], sentinels: Sequence[int], end: int
            ) -> tuple[list[int], list[int]]:
    """(input, target) of ``tokens`` under ``mask``: each run of noise tokens becomes the next
    of ``sentinels`` in the input, and in the target that sentinel then the run; both end with
    ``end``."""
    if len(tokens) != len(mask):
        raise FolnetError(f"span corruption: {len(tokens)} tokens but a mask of {len(mask)}")
    inputs: list[int] = []
    targets: list[int] = []
    used = 0
    for i, (token, noisy) in enumerate(zip(tokens, mask, strict=True)):
        if not noisy:
            inputs.append(token)
            continue
        if i == 0 or not mask[i - 1]:  # a span starts: its sentinel in both
            if used == len(sentinels):
                raise FolnetError(f"span corruption: more spans than the {len(sentinels)} "
                                  f"sentinel tokens")
            inputs.append(sentinels[used])
            targets.append(sentinels[used])
            used += 1
        targets.append(token)
    return [*inputs, end], [*targets, end]
