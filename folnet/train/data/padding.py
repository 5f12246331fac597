"""Cutting the padding off a batch: the one place both training loops trim their batches.

FOLNet's binary stream costs T^2 per layer and its ``t`` operator T^3, so the columns that hold
only padding cost far more than their share of the tokens. Every reduction over positions
leaves pad positions out through the attention mask, so dropping the columns where no row has
a real token changes no real token's output (up to the order of floating-point sums). The
pretraining loop (`folnet.train.pretrain.loop`) and the finetuning batches
(`folnet.train.finetune.loop.batches`) both call `trim_padding`.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

__all__ = ["trim_padding"]


def trim_padding(batch: Mapping[str, torch.Tensor], mask_key: str = "attention_mask"
                 ) -> dict[str, torch.Tensor]:
    """Cut the token axis (the last) of every per-token tensor after the last column where
    any row has a real token.

    Per-token tensors are those with the mask's rank and width (``[..., T]``); the others
    (``labels [B]``, ``nsp_labels [B]``) pass through. Columns are cut only at the end, so a
    left-padded batch keeps every real token. A batch with no real token keeps one column.
    """
    mask = batch.get(mask_key)
    if mask is None:
        return dict(batch)
    width = mask.shape[-1]
    used = mask.reshape(-1, width).any(0)  # [T]: columns holding a real token in some row
    length = int(used.nonzero().max()) + 1 if bool(used.any()) else 1
    if length == width:
        return dict(batch)
    return {key: value[..., :length] if value.ndim == mask.ndim and value.shape[-1] == width
            else value for key, value in batch.items()}
