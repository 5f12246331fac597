"""Batches for the model tests.

`pretraining_batch` is an encoder's pretraining batch (token ids, segment ids, MLM labels at a
few positions, NSP labels). The text-to-text objectives, for the tests of the decoder and the
encoder-decoder: `lm_batch` pads token-id sequences into (input_ids, attention_mask, labels),
optionally with a random PrefixLM split per row; `prefix_lm_batch` splits each sequence at a
random point (the prefix is the input, the rest the target); `span_corruption_batch` is T5's
objective (random spans replaced by sentinel ids in the input; the target lists each sentinel
and its span). Padded on the right; ignored labels are -100.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from folnet.arch.objectives import IGNORE, shift_right
from folnet.errors import FolnetError


def pretraining_batch(vocab: int = 300, B: int = 2, T: int = 12, seed: int = 0,
                      masked: Sequence[int] = (3, 8), nsp: Sequence[int] = (0, 1)):
    """(input_ids, token_type_ids, mlm_labels, nsp_labels): random ids in [5, vocab), the second
    half of each row segment 1, the MLM labels the ids at the ``masked`` positions (-100
    elsewhere: the ids are not replaced), one NSP label per row."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, vocab, (B, T), generator=g)
    types = torch.zeros_like(ids)
    types[:, T // 2 :] = 1
    labels = torch.full_like(ids, IGNORE)
    for position in masked:
        labels[:, position] = ids[:, position]
    return ids, types, labels, torch.tensor(list(nsp))


@dataclass
class LMBatch:
    input_ids: torch.Tensor  # (B, T)
    attention_mask: torch.Tensor  # (B, T) 1 = real token
    labels: torch.Tensor  # (B, T) the ids, -100 on padding
    prefix_lengths: torch.Tensor | None = None  # (B,) PrefixLM split, or None


@dataclass
class Seq2SeqBatch:
    input_ids: torch.Tensor  # (B, N)
    attention_mask: torch.Tensor  # (B, N)
    decoder_input_ids: torch.Tensor  # (B, M) targets shifted right behind the start id
    decoder_attention_mask: torch.Tensor  # (B, M)
    labels: torch.Tensor  # (B, M) targets, -100 on padding


def _sequences(sequences: Sequence[Sequence[int]], min_len: int) -> list[list[int]]:
    if len(sequences) == 0:
        raise FolnetError("sequences is empty; give at least one token-id sequence")
    out = []
    for i, seq in enumerate(sequences):
        ids = seq.tolist() if isinstance(seq, torch.Tensor) else list(seq)
        if len(ids) < min_len:
            raise FolnetError(f"sequences[{i}] has {len(ids)} tokens; this objective needs at "
                              f"least {min_len}")
        out.append([int(t) for t in ids])
    return out


def _pad(rows: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros(len(rows), width, dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, : len(r)] = torch.tensor(r, dtype=torch.long)
        mask[i, : len(r)] = 1
    return ids, mask


def _randint(lo: int, hi: int, generator: torch.Generator | None) -> int:
    """Uniform integer in [lo, hi]."""
    return int(torch.randint(lo, hi + 1, (1,), generator=generator))


def lm_batch(sequences: Sequence[Sequence[int]], *, pad_id: int = 0, prefix_lm: bool = False,
             generator: torch.Generator | None = None) -> LMBatch:
    """A decoder-only batch; with ``prefix_lm`` each row gets a random prefix of 1..T-1 tokens
    (a PrefixLM batch: only the tokens after it are predicted)."""
    rows = _sequences(sequences, 2 if prefix_lm else 1)
    ids, mask = _pad(rows, pad_id)
    labels = ids.masked_fill(mask == 0, IGNORE)
    prefix = None
    if prefix_lm:
        prefix = torch.tensor([_randint(1, len(r) - 1, generator) for r in rows])
    return LMBatch(ids, mask, labels, prefix)


def _seq2seq(inputs: list[list[int]], targets: list[list[int]], pad_id: int,
             start_id: int) -> Seq2SeqBatch:
    ids, mask = _pad(inputs, pad_id)
    tgt, tmask = _pad(targets, pad_id)
    labels = tgt.masked_fill(tmask == 0, IGNORE)
    return Seq2SeqBatch(ids, mask, shift_right(labels, start_id, pad_id), tmask, labels)


def prefix_lm_batch(sequences: Sequence[Sequence[int]], *, pad_id: int = 0,
                    decoder_start_token_id: int = 0,
                    generator: torch.Generator | None = None) -> Seq2SeqBatch:
    """Encoder-decoder prefix LM: each sequence is split at a random point in [1, T-1]; the
    encoder reads the prefix and the decoder predicts the rest."""
    rows = _sequences(sequences, 2)
    cuts = [_randint(1, len(r) - 1, generator) for r in rows]
    return _seq2seq([r[:c] for r, c in zip(rows, cuts, strict=True)],
                    [r[c:] for r, c in zip(rows, cuts, strict=True)], pad_id,
                    decoder_start_token_id)


def _composition(total: int, parts: int, generator: torch.Generator | None) -> list[int]:
    """``total`` split into ``parts`` positive integers, uniformly at random."""
    cuts = sorted((torch.randperm(total - 1, generator=generator)[: parts - 1] + 1).tolist())
    bounds = [0, *cuts, total]
    return [b - a for a, b in itertools.pairwise(bounds)]


def span_corruption_batch(sequences: Sequence[Sequence[int]], sentinel_ids: Sequence[int], *,
                          noise_density: float = 0.15, mean_span_length: float = 3.0,
                          pad_id: int = 0, decoder_start_token_id: int = 0,
                          eos_id: int | None = None,
                          generator: torch.Generator | None = None) -> Seq2SeqBatch:
    """T5 span corruption. Per sequence of T tokens, round(T * noise_density) tokens (at least
    1, at most T-1) in round(noise / mean_span_length) spans (at least 1) are dropped from the
    input, each span replaced by the next of ``sentinel_ids``; the target is every sentinel
    followed by its span (then ``eos_id`` when given)."""
    if not 0.0 < noise_density < 1.0:
        raise FolnetError(f"noise_density must be in (0, 1), got {noise_density!r}")
    if not mean_span_length >= 1.0:
        raise FolnetError(f"mean_span_length must be >= 1, got {mean_span_length!r}")
    rows = _sequences(sequences, 2)
    inputs, targets = [], []
    for i, r in enumerate(rows):
        T = len(r)
        noise = min(max(round(T * noise_density), 1), T - 1)
        spans = max(1, min(round(noise / mean_span_length), noise, T - noise))
        if spans > len(sentinel_ids):
            raise FolnetError(f"sequences[{i}] needs {spans} sentinel ids, sentinel_ids has "
                              f"{len(sentinel_ids)}")
        noise_lens = _composition(noise, spans, generator)
        keep_lens = _composition(T - noise, spans, generator)
        src, tgt, at = [], [], 0
        for k, (keep, drop) in enumerate(zip(keep_lens, noise_lens, strict=True)):
            src.extend(r[at : at + keep])
            src.append(int(sentinel_ids[k]))
            tgt.append(int(sentinel_ids[k]))
            tgt.extend(r[at + keep : at + keep + drop])
            at += keep + drop
        if eos_id is not None:
            tgt.append(eos_id)
        inputs.append(src)
        targets.append(tgt)
    return _seq2seq(inputs, targets, pad_id, decoder_start_token_id)
