"""What the cached and the streaming pretraining datasets share: tokenised documents, segment
pairs for NSP and SOP, and the padded layout of one example.

Pairs are `[CLS] A [SEP] B [SEP]` from runs of whole sentences. NSP: B is the true continuation
half of the time (label 0), otherwise a segment of another document (label 1). SOP: A and B are
consecutive and swapped half of the time (label 1).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Iterator

import numpy as np
import torch

from folnet.train.data.config import PretrainDataConfig
from folnet.train.data.tokenizer import FolnetTokenizer

__all__ = ["Document", "Example", "ExampleLayout", "segment_pairs", "token_dtype",
           "tokenise_documents"]

Example = dict[str, torch.Tensor]
Document = list[np.ndarray]  # one int array of token ids per sentence


def token_dtype(tokenizer: FolnetTokenizer) -> type:
    """The narrowest integer type that holds every id (uint16 for vocabularies up to 65536)."""
    return np.uint16 if tokenizer.vocab_size <= 1 << 16 else np.int32


def tokenise_documents(
    documents: Iterable[list[str]], tokenizer: FolnetTokenizer, batch_documents: int = 256
) -> Iterator[Document]:
    """Documents of sentences -> documents of id arrays; empty sentences/documents dropped.
    Sentences of `batch_documents` documents go to the Rust tokenizer in one call. A byte-level
    BPE reads every sentence but a document's first after a space, so that a document's
    sentences laid end to end (a decoder's packed rows) decode as its text."""
    dtype = token_dtype(tokenizer)
    spaced = not tokenizer.wordpiece  # WordPiece ignores the space; a BPE keeps it
    batch: list[list[str]] = []

    def flush() -> Iterator[Document]:
        flat = [" " + sentence if spaced and i else sentence
                for document in batch for i, sentence in enumerate(document)]
        ids = iter(tokenizer.encode_batch(flat))
        for document in batch:
            arrays = [np.asarray(next(ids), dtype=dtype) for _ in document]
            arrays = [a for a in arrays if len(a)]
            if arrays:
                yield arrays

    for document in documents:
        batch.append(document)
        if len(batch) >= batch_documents:
            yield from flush()
            batch = []
    yield from flush()


# -- pairing -----------------------------------------------------------------------------------


def _take(document: Document, start: int, target: int) -> np.ndarray:
    """Whole sentences from `start` on until at least `target` tokens (or the end)."""
    pieces, length = [], 0
    for sentence in document[start:]:
        pieces.append(sentence)
        length += len(sentence)
        if length >= target:
            break
    return np.concatenate(pieces)


def _truncate(
    a: np.ndarray, b: np.ndarray, limit: int, rng: random.Random
) -> tuple[np.ndarray, np.ndarray]:
    """BERT's truncation in closed form: drop tokens from the longer side (B on ties), each
    from the front or the back with probability 1/2."""
    excess = len(a) + len(b) - limit
    if excess <= 0:
        return a, b
    diff = len(a) - len(b)
    first = min(abs(diff), excess)
    cut_a, cut_b = (first, 0) if diff > 0 else (0, first)
    rest = excess - first
    cut_a, cut_b = cut_a + rest // 2, cut_b + (rest + 1) // 2

    def cut(x: np.ndarray, n: int) -> np.ndarray:
        front = rng.getrandbits(n).bit_count() if n else 0  # Binomial(n, 1/2)
        return x[front : len(x) - (n - front)]

    return cut(a, cut_a), cut(b, cut_b)


def segment_pairs(
    document: Document,
    config: PretrainDataConfig,
    rng: random.Random,
    other_document: Callable[[], Document],
) -> Iterator[tuple[np.ndarray, np.ndarray, int]]:
    """BERT's create_instances_from_document, with one change: a chunk is only closed once
    it has two sentences (a lone final sentence is dropped), so every example gets a fair
    coin for its label and NSP/SOP stay balanced."""
    limit = config.seq_len - 3  # room for [CLS], [SEP], [SEP]
    target = rng.randint(2, limit) if rng.random() < config.short_seq_prob else limit
    chunk: Document = []
    length, i = 0, 0
    while i < len(document):
        chunk.append(document[i])
        length += len(document[i])
        if (length >= target and len(chunk) >= 2) or i == len(document) - 1:
            if len(chunk) >= 2:
                a_end = rng.randint(1, len(chunk) - 1)
                a = np.concatenate(chunk[:a_end])
                if config.objective == "nsp" and rng.random() < 0.5:
                    other = other_document()
                    b = _take(other, rng.randrange(len(other)), max(1, target - len(a)))
                    label = 1
                    i -= len(chunk) - a_end  # the unused sentences start the next chunk
                else:
                    b = np.concatenate(chunk[a_end:])
                    label = 0
                    if config.objective == "sop" and rng.random() < 0.5:
                        a, b, label = b, a, 1
                a, b = _truncate(a, b, limit, rng)
                yield a, b, label
            chunk, length = [], 0
        i += 1


class ExampleLayout:
    """Turns (A, B, label) into the padded tensors of one example (see `folnet.train.data.corpus`
    for the layout)."""

    def __init__(self, tokenizer: FolnetTokenizer, seq_len: int) -> None:
        self.cls, self.sep, self.pad = tokenizer.cls_id, tokenizer.sep_id, tokenizer.pad_id
        self.seq_len = seq_len
        self.positions = np.arange(seq_len)

    def __call__(self, a: np.ndarray, b: np.ndarray, label: int) -> Example:
        la, lb, t = len(a), len(b), self.seq_len
        used = la + lb + 3
        ids = np.full(t, self.pad, dtype=np.int64)  # [T]
        ids[0], ids[la + 1], ids[used - 1] = self.cls, self.sep, self.sep
        ids[1 : la + 1] = a
        ids[la + 2 : used - 1] = b
        types = np.zeros(t, dtype=np.int64)  # [T]
        types[la + 2 : used] = 1
        return {
            "input_ids": torch.from_numpy(ids),
            "token_type_ids": torch.from_numpy(types),
            "attention_mask": torch.from_numpy(self.positions < used),  # [T] bool
            "nsp_labels": torch.tensor(label, dtype=torch.long),
        }
