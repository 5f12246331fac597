"""An encoder-decoder's pretraining rows: the corpus packed into rows (`folnet.train.data.corpus
.build_packed_dataset`, documents end to end, each ending in [SEP]), each row span-corrupted
(`folnet.train.data.spans`) into the encoder's input and the decoder's target.

The packed rows are as long as the longest that corrupts into ``seq_len`` input tokens
(`raw_length`), so that every full row's input is exactly ``seq_len`` long and its target
``target_length`` (the last row, shorter, is padded; its target labels -100 there). The
sentinels are special tokens at the end of the tokenizer's vocabulary -- T5's extra ids
``<extra_id_0>`` ..., `SENTINELS` of them, which the run adds to its tokenizer
(`folnet.train.data.tokenizer.FolnetTokenizer.with_sentinels`), so that the model's vocabulary
is the tokenizer's and decoding names them.

Each row's corruption is drawn once, from a generator seeded by the run's seed and the row's
index: the same row corrupts the same way in every epoch and after a resume, with nothing to
keep in a checkpoint.

Shapes: input_ids, attention_mask (seq_len,); labels, decoder_attention_mask (target_length,).
"""

from __future__ import annotations

import dataclasses
import random

import torch
from torch.utils.data import Dataset

from folnet.errors import FolnetError
from folnet.train.data.config import DATA_AT_LEAST, PretrainDataConfig
from folnet.train.data.corpus import PackedDataset, build_packed_dataset
from folnet.train.data.documents import CorpusSource
from folnet.train.data.spans import corrupt, corrupted_lengths, noise_mask, span_counts
from folnet.train.data.tokenizer import FolnetTokenizer

__all__ = ["SENTINELS", "SpanDataset", "build_span_dataset", "raw_length"]

#: Sentinel ids the model's vocabulary adds (T5's extra ids).
SENTINELS = 100
_IGNORE = -100


def raw_length(seq_len: int, rate: float, mean_span: float) -> int:
    """The longest row whose corrupted input is at most ``seq_len`` tokens (longer than
    ``seq_len`` when spans are longer than one token: each span's tokens become one sentinel)."""
    def fits(n: int) -> bool:
        return corrupted_lengths(n, rate, mean_span)[0] <= seq_len

    n = seq_len
    while n > 2 and not fits(n):
        n -= 1
    if not fits(n):
        raise FolnetError(f"--seq-len {seq_len} is too short for span corruption")
    while fits(n + 1):
        n += 1
    if n < DATA_AT_LEAST["seq_len"]:  # the packed rows' own least length
        raise FolnetError(f"--seq-len {seq_len} is too short for span corruption: its rows "
                          f"would hold {n} tokens, fewer than {DATA_AT_LEAST['seq_len']}")
    spans = span_counts(n, rate, mean_span)[1]
    if spans > SENTINELS:
        raise FolnetError(f"--seq-len {seq_len} corrupts into {spans} spans, more than the "
                          f"{SENTINELS} sentinels; raise --mean-span or lower --span-rate")
    return n


class SpanDataset(Dataset):
    """Packed rows, each corrupted into (input, target) as the module docstring says."""

    def __init__(self, rows: PackedDataset, tokenizer: FolnetTokenizer,
                 config: PretrainDataConfig, raw: int) -> None:
        self.rows, self.config, self.raw = rows, config, raw
        self.end, self.pad = tokenizer.sep_id, tokenizer.pad_id
        self.sentinels = tokenizer.sentinel_ids[:SENTINELS]
        if len(self.sentinels) < SENTINELS:
            raise FolnetError(f"span corruption needs {SENTINELS} sentinel tokens "
                              f"(<extra_id_0> ...) in the tokenizer, which has "
                              f"{len(self.sentinels)}: use FolnetTokenizer.with_sentinels")
        self.target_length = corrupted_lengths(raw, config.span_rate, config.mean_span)[1]
        self.cache_status, self.num_documents = rows.cache_status, rows.num_documents

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        row = self.rows[index]
        real = int(row["attention_mask"].sum())
        tokens = row["input_ids"][:real].tolist()
        if real < 2:  # a last row of one token: nothing to cut out
            inputs, targets = [*tokens, self.end], [self.end]
        else:
            rng = random.Random(f"folnet-spans-{self.config.seed}-{index % len(self)}")
            mask = noise_mask(real, self.config.span_rate, self.config.mean_span, rng)
            inputs, targets = corrupt(tokens, mask, self.sentinels, self.end)
        seq_len = self.config.seq_len
        return {"input_ids": _padded(inputs, seq_len, self.pad),
                "attention_mask": _padded([1] * len(inputs), seq_len, 0),
                "labels": _padded(targets, self.target_length, _IGNORE),
                "decoder_attention_mask": _padded([1] * len(targets), self.target_length, 0)}


def _padded(values: list[int], length: int, fill: int) -> torch.Tensor:
    return torch.tensor(values + [fill] * (length - len(values)), dtype=torch.long)


def build_span_dataset(source: CorpusSource, tokenizer: FolnetTokenizer,
                       config: PretrainDataConfig, *, part: str = "train") -> SpanDataset:
    """`SpanDataset` of ``source``: the packed rows cached as `build_packed_dataset`'s (of
    ``part``, "train" or "heldout")."""
    raw = raw_length(config.seq_len, config.span_rate, config.mean_span)
    rows = build_packed_dataset(source, tokenizer, dataclasses.replace(config, seq_len=raw),
                                part=part)
    return SpanDataset(rows, tokenizer, config, raw)
