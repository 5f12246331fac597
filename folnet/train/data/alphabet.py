"""Which characters a trained WordPiece vocabulary keeps, so that it never exceeds its size.

Why: each character takes two entries (``c``, and ``##c`` for inside a word) before any merge
is learnt, and the `tokenizers` trainer keeps every character it sees, so text with thousands
of distinct characters overshot the vocabulary size (3,213 entries for ``--vocab-size 200``).
`bounded_alphabet` keeps every character when they fit; otherwise the most frequent that fit
(ties broken by code point, so the choice is deterministic), with a warning: words with the
others become [UNK], as in BERT. A size too small for even one character is an error.
"""

from __future__ import annotations

import warnings
from collections import Counter
from collections.abc import Callable, Iterable

from folnet.errors import FolnetError

__all__ = ["bounded_alphabet"]


def bounded_alphabet(normalize: Callable[[str], str], texts: Iterable[str], vocab_size: int,
                     specials: int) -> list[str]:
    """The non-space characters of the `normalize`d texts, sorted: all of them, or the most
    frequent that fit in `vocab_size` entries beside `specials` special tokens (two each)."""
    raw: Counter[str] = Counter()
    for text in texts:
        raw.update(text)
    counts: Counter[str] = Counter()
    for char, count in raw.items():  # normalising one character at a time is cheap
        for normal in normalize(char):
            if not normal.isspace():
                counts[normal] += count
    room = (vocab_size - specials) // 2
    if len(counts) <= room:
        return sorted(counts)
    if room < 1:
        raise FolnetError(f"vocab_size {vocab_size} leaves no room for any character: the "
                          f"{specials} special tokens take {specials} entries and each "
                          f"character 2 (c and ##c); use at least {specials + 2}")
    ranked = sorted(counts, key=lambda c: (-counts[c], c))
    warnings.warn(f"the tokenizer's training text has {len(counts):,} distinct characters but "
                  f"vocab_size {vocab_size} has room for {room} (each takes 2 entries, c and "
                  f"##c): the {room} most frequent are kept, and words with any other read as "
                  f"[UNK]", stacklevel=3)
    return sorted(ranked[:room])
