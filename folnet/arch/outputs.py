"""What a forward pass returns. Fields a model or head does not produce stay None."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class FolnetOutput:
    """An encoder's forward pass (with its head's fields)."""

    sequence_output: torch.Tensor  # (B, T, D1) final unary atoms
    pooled_output: torch.Tensor  # (B, D1) tanh(Linear) of token 0
    relation_output: torch.Tensor | None  # (B, T, T, D2) final binary atoms; None when
    # the model's ``relations`` is off
    loss: torch.Tensor | None = None
    mlm_logits: torch.Tensor | None = None  # (B, T, V) or (N, V) when only masked positions
    nsp_logits: torch.Tensor | None = None  # (B, 2)
    logits: torch.Tensor | None = None  # task head
    start_logits: torch.Tensor | None = None  # qa
    end_logits: torch.Tensor | None = None  # qa
    mlm_labels: torch.Tensor | None = None  # the labels matching mlm_logits rows when gathered


@dataclass
class TextOutput:
    """A text-to-text forward pass; for the encoder-decoder the sequence/relation outputs are the
    decoder's (M rows; relations over inputs then targets)."""

    logits: torch.Tensor  # (B, T, V) next-token logits
    sequence_output: torch.Tensor  # (B, T, D1) final unary atoms
    relation_output: torch.Tensor  # (B, T, n, D2) final binary atoms (n = T for decoder-only)
    loss: torch.Tensor | None = None
    encoder_sequence_output: torch.Tensor | None = None  # (B, N, D1)
    encoder_relation_output: torch.Tensor | None = None  # (B, N, N, D2)
