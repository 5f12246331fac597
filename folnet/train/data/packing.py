"""Packed rows for a decoder's pretraining: documents laid end to end, each followed by an end
token, and cut into rows of ``seq_len`` tokens, every row full (no padding to waste the square
on) but the last.

A row holds pieces of several documents, and ``document_ids`` numbers them within the row
(0, 1, 2, ...): the decoder (`folnet.arch.models.decoder.FolnetDecoderLM`, its
``document_ids``) lets a position see only earlier positions of its own piece, restarts the
positions at each piece's first token and predicts no token across a boundary. So a piece
computes what it would alone in a row of its own: attention never crosses a document, which
tests/train/test_packing.py checks by changing one document and watching another's loss. A
document longer than a row continues in the next row as a new piece (the first token of a row
starts one).

Shapes: rows (seq_len,) int64 token ids and document ids.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import torch

from folnet.errors import FolnetError

__all__ = ["PackedCollator", "heldout_documents", "pack_documents"]


def heldout_documents(count: int, fraction: float, seed: int) -> frozenset[int]:
    """The indices of ``count`` documents held out for evaluation: ``round(count * fraction)``
    of them (at least one when ``fraction`` > 0, never all), drawn under ``seed``."""
    if fraction <= 0.0 or count < 2:
        return frozenset()
    k = min(max(round(count * fraction), 1), count - 1)
    return frozenset(random.Random(f"folnet-heldout-{seed}").sample(range(count), k))


def pack_documents(documents: Iterable[Iterable[int]], seq_len: int, end: int, *,
                   pad: int = 0, alone: bool = False
                   ) -> Iterator[tuple[np.ndarray, np.ndarray, int]]:
    """(token ids, document ids, real tokens) of each packed row of ``seq_len`` tokens; each
    document is its tokens then ``end``. The last row is padded with ``pad`` (document id -1)
    after its real tokens; an empty document is skipped. ``alone``: no row holds two documents
    (each document's last row is padded; the PrefixLM's rows)."""
    if isinstance(seq_len, bool) or not isinstance(seq_len, int) or seq_len < 2:
        raise FolnetError(f"pack_documents: seq_len must be an integer >= 2, got {seq_len!r}")
    ids = np.empty(seq_len, dtype=np.int64)
    docs = np.empty(seq_len, dtype=np.int64)
    filled, piece = 0, 0
    for document in documents:
        tokens = np.fromiter(document, dtype=np.int64)
        if tokens.size == 0:
            continue
        stream = np.append(tokens, end)
        while stream.size:
            take = min(seq_len - filled, stream.size)
            ids[filled : filled + take] = stream[:take]
            docs[filled : filled + take] = piece
            filled, stream = filled + take, stream[take:]
            piece += 1
            if filled == seq_len:
                yield ids.copy(), docs.copy(), seq_len
                filled, piece = 0, 0
        if alone and filled:
            ids[filled:], docs[filled:] = pad, -1
            yield ids.copy(), docs.copy(), filled
            filled, piece = 0, 0
    if filled:
        ids[filled:], docs[filled:] = pad, -1
        yield ids.copy(), docs.copy(), filled


class PackedCollator:
    """A decoder's or an encoder-decoder's batches: the rows' ``keys`` stacked, nothing drawn
    (a decoder's rows are read whole, an encoder-decoder's corrupted when they are made), so
    its state -- what a checkpoint keeps of a collator -- is empty. The step loop's
    ``apply_mask`` passes a batch through."""

    DECODER = ("input_ids", "document_ids", "attention_mask")
    PREFIX = (*DECODER, "prefix_lengths")  # `folnet.train.data.prefix_rows`
    ENCODER_DECODER = ("input_ids", "attention_mask", "labels", "decoder_attention_mask")

    def __init__(self, keys: Sequence[str] = DECODER) -> None:
        self.keys = tuple(keys)

    def collate(self, items: Sequence[Mapping[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
        """Each key's rows stacked: [B, ...]."""
        return {key: torch.stack([item[key] for item in items]) for key in self.keys}

    def apply_mask(self, batch: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return dict(batch)

    def __call__(self, items: Sequence[Mapping[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
        return self.collate(items)

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if state:  # an encoder's masking state: the checkpoint is another kind's
            raise FolnetError("the checkpoint's collator state is an encoder's masking state; "
                              "packed rows keep none")
