"""A byte-level BPE tokenizer, the tokenizer for generation: cased, no normaliser, every byte in
the alphabet, so that ``decode(encode(text)) == text`` for any text and decoded output reads as
text (no WordPiece ``##`` joins, no spaces around punctuation).

It carries folnet's five special tokens with their usual ids ([PAD]=0 ... [MASK]=4, so every
pipeline reads it as it reads a WordPiece); [CLS] serves as the start of a text and [SEP] as its
end (a decoder's packed documents end in it; `FolnetTokenizer.save` names them bos_token and
eos_token for transformers). Unlike a WordPiece, it adds no special token to a single text, so
a decoder's prompt is the text itself (`folnet.train.data.tokenizer.FolnetTokenizer`).

`folnet pretrain --tokenizer-model bpe` trains one on the corpus. The same texts give the same
vocabulary in any process (tests/data/test_bpe.py).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Sequence

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from folnet.errors import FolnetError
from folnet.train.data.tokenizer import FolnetTokenizer
from folnet.train.data.tokenizer_inputs import (
    MIN_BPE_VOCAB,
    SPECIAL_TOKENS,
    TOKENIZER_MODELS,
    chain_files,
    training_inputs,
)

__all__ = ["MIN_BPE_VOCAB", "TOKENIZER_MODELS", "train_bpe_tokenizer"]



def _byte_level(tokenizer: Tokenizer) -> Tokenizer:
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    return tokenizer


def train_bpe_tokenizer(
    files: Sequence[str | os.PathLike[str]] | None = None,
    *,
    texts: Iterable[str] | Callable[[], Iterable[str]] | None = None,
    vocab_size: int = 32768,
    min_frequency: int = 2,
    encoding: str = "utf-8",
) -> FolnetTokenizer:
    """Train a byte-level BPE of at most ``vocab_size`` entries on text files and/or texts."""
    paths, make_texts = training_inputs(files, texts, vocab_size, min_frequency)
    if vocab_size < MIN_BPE_VOCAB:
        raise FolnetError(f"vocab_size must be at least {MIN_BPE_VOCAB} for a byte-level BPE "
                          f"(the {len(SPECIAL_TOKENS)} special tokens and 256 bytes), got "
                          f"{vocab_size}")
    tokenizer = _byte_level(Tokenizer(models.BPE()))
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=min_frequency,
                                  special_tokens=list(SPECIAL_TOKENS), show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(chain_files(paths, make_texts(), encoding), trainer)
    if tokenizer.get_vocab_size() <= MIN_BPE_VOCAB and not any(
            True for _ in chain_files(paths, make_texts(), encoding)):
        raise FolnetError("tokenizer training saw no text: the training corpus is empty")
    return FolnetTokenizer(tokenizer, source="<trained>")
