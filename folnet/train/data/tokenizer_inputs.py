"""What a tokenizer trains on, for both trainers (`folnet.train.data.tokenizer`'s WordPiece and
`folnet.train.data.bpe`'s byte-level BPE): the arguments checked, each fault named, and the
files and texts read as one stream of lines."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path

from folnet.errors import FolnetError
from folnet.train.data.checks import first_undecodable_line

__all__ = ["MIN_BPE_VOCAB", "SENTINEL_TOKEN", "SPECIAL_TOKENS", "TOKENIZER_MODELS", "chain_files",
           "training_inputs"]

#: The special tokens every folnet vocabulary starts with, in this order (ids 0 to 4).
SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
#: The name of span sentinel i, T5's: an encoder-decoder's vocabulary ends in them.
SENTINEL_TOKEN = "<extra_id_{}>"
#: The tokenizers a run can train: BERT's uncased WordPiece, or a byte-level BPE
#: (`folnet.train.data.bpe`). Here, not there: the run's options read them without importing
#: the `tokenizers` library (the train extra), so that a missing extra is a one-line error.
TOKENIZER_MODELS = ("wordpiece", "bpe")
#: The smallest byte-level vocabulary: the specials and the 256 bytes.
MIN_BPE_VOCAB = len(SPECIAL_TOKENS) + 256


def training_inputs(files: Sequence[str | os.PathLike[str]] | str | os.PathLike[str] | None,
                     texts: Iterable[str] | Callable[[], Iterable[str]] | None,
                     vocab_size: int, min_frequency: int
                     ) -> tuple[list[Path], Callable[[], Iterable[str]]]:
    """`train_tokenizer`'s arguments checked, each fault named: the files as paths, and the
    texts as a callable that yields them afresh (the training reads them twice)."""
    if files is None and texts is None:
        raise FolnetError("train_tokenizer needs `files` or `texts`")
    if isinstance(files, (str, os.PathLike)):
        files = [files]  # a lone path is a common slip; accept it rather than iterate chars
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, int):
        raise FolnetError(f"vocab_size must be an integer, got {vocab_size!r}")
    if vocab_size <= len(SPECIAL_TOKENS):
        raise FolnetError(f"vocab_size must exceed {len(SPECIAL_TOKENS)}, got {vocab_size}")
    if isinstance(min_frequency, bool) or not isinstance(min_frequency, int) or min_frequency < 1:
        raise FolnetError(f"min_frequency must be a positive integer, got {min_frequency!r}")
    paths = [Path(f) for f in files or ()]
    for path in paths:
        if not path.is_file():
            raise FolnetError(f"tokenizer training file {str(path)!r} does not exist")
    if texts is None:
        make_texts: Callable[[], Iterable[str]] = tuple
    elif callable(texts):
        make_texts = texts
    else:
        if not isinstance(texts, Sequence):
            texts = list(texts)  # read twice below
        kept = texts
        make_texts = lambda: kept  # noqa: E731
    return paths, make_texts


def chain_files(paths: Sequence[Path], texts: Iterable[str], encoding: str) -> Iterator[str]:
    for path in paths:
        try:
            with path.open(encoding=encoding) as handle:
                yield from handle
        except UnicodeDecodeError:
            bad = first_undecodable_line(path, encoding)
            where = f" on line {bad[0]} ({bad[1]})" if bad is not None else ""
            raise FolnetError(f"tokenizer training file {str(path)!r} is not valid {encoding}"
                              f"{where}; pass the file's encoding") from None
    yield from texts
