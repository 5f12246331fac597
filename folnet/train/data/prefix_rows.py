"""A decoder's PrefixLM rows (``--objective prefix``): one document per row, and a prefix that
the decoder reads both ways before it predicts the rest, token by token.

Why a document per row: the decoder takes no ``document_ids`` with a prefix (a packed row's
pieces are causal documents of their own, `folnet.arch.packed`), so a prefix row holds one
document -- its tokens and [SEP], padded after, a document longer than a row continuing in the
next row (`folnet.train.data.packing.pack_documents` with ``alone``) -- and nothing in it can
attend across a document.

Each row's prefix length is drawn once, uniformly from 1 to its real length minus one, from a
generator seeded by the run's seed and the row's index: the same row splits the same way in
every epoch and after a resume, with nothing to keep in a checkpoint. The loss counts the
tokens after the prefix (`folnet.train.pretrain.objectives.lm_targets`).

Shapes: input_ids, document_ids, attention_mask (seq_len,); prefix_lengths () int64.
"""

from __future__ import annotations

import dataclasses

import torch
from torch.utils.data import Dataset

from folnet.train.data.config import PretrainDataConfig
from folnet.train.data.corpus import PackedDataset, build_packed_dataset
from folnet.train.data.documents import CorpusSource
from folnet.train.data.tokenizer import FolnetTokenizer

__all__ = ["PrefixDataset", "build_prefix_dataset", "prefix_length"]


def prefix_length(seed: int, index: int, real: int) -> int:
    """Row ``index``'s prefix: uniform in [1, real - 1] (1 for a row of fewer than 3 tokens),
    drawn from a generator seeded by ``seed`` and ``index``."""
    if real < 3:
        return 1
    draw = torch.Generator().manual_seed(seed * 1_000_003 + index)
    return 1 + int(torch.randint(real - 1, (), generator=draw))


class PrefixDataset(Dataset):
    """A document per row (`PackedDataset`'s rows), each with its ``prefix_lengths``."""

    def __init__(self, rows: PackedDataset, seed: int) -> None:
        self.rows, self.seed = rows, seed
        self.cache_status, self.num_documents = rows.cache_status, rows.num_documents

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        row = self.rows[index]
        real = int(row["attention_mask"].sum())
        index %= len(self)  # a negative index draws as its row
        return {**row, "prefix_lengths": torch.tensor(prefix_length(self.seed, index, real))}


def build_prefix_dataset(source: CorpusSource, tokenizer: FolnetTokenizer,
                         config: PretrainDataConfig, *, part: str = "train") -> PrefixDataset:
    """The PrefixLM's rows of ``source`` (``part`` as `build_packed_dataset`'s)."""
    rows = build_packed_dataset(source, tokenizer, dataclasses.replace(config,
                                                                       objective="prefix"),
                                part=part)
    return PrefixDataset(rows, config.seed)
