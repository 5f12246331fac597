"""Task heads on top of the encoder's outputs (DESIGN.md section 3 for the released ones)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from folnet.arch.config import ModelConfig

HEADS = ("pretraining", "mlm", "classification", "multiple-choice", "qa",
         "token-classification")


class MLMHead(nn.Module):
    """Linear -> GELU -> LayerNorm (no affine) -> decoder tied to the word embedding + bias."""

    def __init__(self, cfg: ModelConfig, word_embedding: nn.Embedding):
        super().__init__()
        self.cfg = cfg
        self.transform = nn.Linear(cfg.D1, cfg.D1)
        # Tied: the decoder weight *is* the word embedding. Held without registering it as a
        # submodule so the state dict has one key for it.
        object.__setattr__(self, "_word", word_embedding)
        self.bias = nn.Parameter(torch.zeros(cfg.padded_vocab))

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        h = F.layer_norm(F.gelu(self.transform(hidden)), (self.cfg.D1,),
                         eps=self.cfg.layer_norm_eps)
        return F.linear(h, self._word.weight, self.bias)  # (..., padded vocab)


class PoolerClassifier(nn.Module):
    """Dropout -> Linear on the pooled output (sequence classification / regression / NSP)."""

    def __init__(self, d1: int, num_labels: int, dropout: float):
        super().__init__()
        self.dropout = nn.Dropout(dropout)
        self.linear = nn.Linear(d1, num_labels)

    def forward(self, pooled: torch.Tensor) -> torch.Tensor:
        return self.linear(self.dropout(pooled))


def mlm_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Cross-entropy over the positions whose label is not -100."""
    return F.cross_entropy(logits.flatten(0, -2).float(), labels.flatten(), ignore_index=-100)


def gather_masked(hidden: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The hidden states and labels of the predicted positions only: ``(N, D1)``, ``(N,)``.

    The vocabulary projection is the largest matrix product of a small FOLNet; computing it for
    the ~15% masked positions instead of every token saves most of it.
    """
    where = labels != -100
    return hidden[where], labels[where]
