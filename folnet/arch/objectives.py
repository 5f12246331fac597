"""The losses of the text models: token cross-entropy (every head's), next-token prediction
(`lm_loss`, decoders), the encoder-decoder's (`seq2seq_loss`, with `shift_right` making its
decoder inputs). Ignored label positions are -100 (`IGNORE`)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

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
