"""Pretraining objectives of the text-to-text FOLNets, usable from a training loop.

* Decoder-only: next-token prediction (`lm_loss`); `lm_batch` pads token-id sequences into
  (input_ids, attention_mask, labels), optionally with a random PrefixLM split per row.
* Encoder-decoder: `prefix_lm_batch` (split each sequence at a random point: the prefix is the
  input, the rest the target) and `span_corruption_batch` (T5's objective: random spans are
  replaced by sentinel ids in the input; the target lists each sentinel and its span).

Batches are padded on the right; ignored label positions are -100.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from folnet.errors import FolnetError

IGNORE = -100


def token_cross_entropy(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of logits (N, C) against labels (N,) over the labels that are not
    -100; **0 when every label is -100** (nothing to predict).

    Why 0 and not an error or NaN: torch's mean over no targets is 0/0 = NaN, which poisons a
    training step (and a NaN guard would count it as a fault). A batch with nothing to predict
    is legitimate and rare -- short sequences where the 15% MLM draw masked no token, a
    one-token decoder row, a PrefixLM prefix covering the whole row -- so it must not crash a
    run either. The value is the sum over the targets divided by max(count, 1): the usual mean
    when there are targets (same value and gradient), an exact 0 connected to the graph when
    there are none, so ``loss.backward()`` works and gives zero gradients. No host sync, no
    data-dependent branch (torch.compile and CUDA graphs see one graph). Every folnet loss over
    ignorable labels (MLM, NSP, classification, QA, token classification, next-token, PrefixLM,
    encoder-decoder) uses it, so all behave alike."""
    total = F.cross_entropy(logits.float(), labels, ignore_index=IGNORE, reduction="sum")
    count = (labels != IGNORE).sum()  # () int
    return total / count.clamp_min(1)


def lm_loss(logits: torch.Tensor, labels: torch.Tensor,
            prefix_lengths: torch.Tensor | None = None,
            positions: torch.Tensor | None = None) -> torch.Tensor:
    """Next-token cross-entropy: position i predicts labels[i + 1]. With ``prefix_lengths`` only
    tokens after each row's prefix are predicted (the PrefixLM objective), the prefix counted in
    ``positions`` ((B|1, T), default 0..T-1: from each row's first real token). logits
    (B, T, V), labels (B, T) with -100 for ignored tokens. With no target at all (T = 1, every
    label -100, a prefix covering every row) the loss is 0 (`token_cross_entropy`)."""
    target = labels[:, 1:]  # (B, T-1)
    if prefix_lengths is not None:
        pos = (torch.arange(1, labels.shape[1], device=labels.device)[None]
               if positions is None else positions[:, 1:])  # (B|1, T-1)
        target = target.masked_fill(pos < prefix_lengths[:, None], IGNORE)
    return token_cross_entropy(logits[:, :-1].flatten(0, 1), target.flatten())


def seq2seq_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of decoder logits (B, M, V) against the targets (B, M) (no shift: the
    decoder input is the target shifted right); 0 when every target is -100."""
    return token_cross_entropy(logits.flatten(0, 1), labels.flatten())


def shift_right(labels: torch.Tensor, start_id: int, pad_id: int = 0) -> torch.Tensor:
    """Decoder inputs from targets: ``[start, y_0, ..., y_{M-2}]`` with -100 replaced by pad."""
    shifted = labels.new_full(labels.shape, start_id)
    shifted[:, 1:] = labels[:, :-1]
    return shifted.masked_fill(shifted == IGNORE, pad_id)


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
