"""What each kind of model pretrains on, as the step loop sees it: the module DDP/FSDP wrap (the
model's forward, its losses and metrics: `PretrainingForward` for an encoder, `NextTokenForward`
for a decoder, `SpanForward` for an encoder-decoder), which batch tensors it takes, and how many
token targets a micro-batch holds.

Both engines return the same five sums, ``(token_loss_sum, sequence_loss_sum, token_correct,
sequence_correct, targets)`` (0-dim tensors), so that the loop (`folnet.train.pretrain.loop`)
normalises and logs every kind alike (`folnet.train.pretrain.metrics.StepMetrics`). Why a
module of its own: FOLNet's last layer writes a final binary stream that no pretraining loss
reads, so the parameters of its binary-output operators get no gradient. DDP's
unused-parameter search walks back from the forward's outputs; were the relation output among
them, those parameters would look used and DDP would wait for their gradients forever.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from folnet.arch.objectives import IGNORE
from folnet.arch.packed import document_labels

__all__ = [
    "NextTokenForward",
    "PretrainingForward",
    "SpanForward",
    "engine_inputs",
    "forward_of",
    "token_targets",
]


class PretrainingForward(nn.Module):
    """An encoder's sums from a FolnetModel whose ``gather_mlm`` is a slot count: MLM
    cross-entropy over the gathered targets, NSP/SOP over the sequences."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor,
                attention_mask: torch.Tensor | None, mlm_labels: torch.Tensor,
                nsp_labels: torch.Tensor) -> tuple[torch.Tensor, ...]:
        out = self.model(input_ids, token_type_ids, attention_mask, mlm_labels=mlm_labels)
        # (N, V) logits at the gathered slots (unused ones labelled -100), (B, 2)
        mlm_logits, labels = out.mlm_logits.float(), out.mlm_labels
        nsp_logits = out.nsp_logits.float()
        mlm_sum = F.cross_entropy(mlm_logits, labels, reduction="sum")
        nsp_sum = F.cross_entropy(nsp_logits, nsp_labels, reduction="sum")
        with torch.no_grad():
            mlm_correct = (mlm_logits.argmax(-1) == labels).sum()
            nsp_correct = (nsp_logits.argmax(-1) == nsp_labels).sum()
            targets = (labels != IGNORE).sum()
        return mlm_sum, nsp_sum, mlm_correct, nsp_correct, targets


class NextTokenForward(nn.Module):
    """A decoder's sums over packed rows: next-token cross-entropy over every position whose
    next token is a real token of its own document (`folnet.arch.packed`). With
    ``prefix_lengths`` (the PrefixLM's rows, a document each: `folnet.train.data.prefix_rows`)
    the row's prefix reads both ways and only the tokens after it are predicted."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, document_ids: torch.Tensor,
                attention_mask: torch.Tensor | None,
                prefix_lengths: torch.Tensor | None = None) -> tuple[torch.Tensor, ...]:
        if prefix_lengths is None:
            out = self.model(input_ids, attention_mask=attention_mask, document_ids=document_ids)
        else:  # one document per row: its pieces need no mask of their own
            out = self.model(input_ids, prefix_lengths=prefix_lengths,
                             attention_mask=attention_mask)
        labels = lm_targets(input_ids, document_ids, attention_mask, prefix_lengths)  # (B, T)
        logits = out.logits[:, :-1].float().flatten(0, 1)  # (B (T-1), V)
        target = labels[:, 1:].flatten()
        loss_sum = F.cross_entropy(logits, target, reduction="sum")
        with torch.no_grad():
            correct = (logits.argmax(-1) == target).sum()
            targets = (target != IGNORE).sum()
        zero = loss_sum.new_zeros(())
        return loss_sum, zero, correct, zero.long(), targets


class SpanForward(nn.Module):
    """An encoder-decoder's sums over span-corrupted rows (`folnet.train.data.span_rows`): the
    decoder's cross-entropy over its targets (the sentinels and the spans they stand for; the
    decoder reads them shifted right behind the start token)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None,
                labels: torch.Tensor, decoder_attention_mask: torch.Tensor
                ) -> tuple[torch.Tensor, ...]:
        out = self.model(input_ids, labels=labels, attention_mask=attention_mask,
                         decoder_attention_mask=decoder_attention_mask)
        logits = out.logits.float().flatten(0, 1)  # (B M, V)
        target = labels.flatten()
        loss_sum = F.cross_entropy(logits, target, reduction="sum")
        with torch.no_grad():
            correct = (logits.argmax(-1) == target).sum()
            targets = (target != IGNORE).sum()
        zero = loss_sum.new_zeros(())
        return loss_sum, zero, correct, zero.long(), targets


def lm_targets(input_ids: torch.Tensor, document_ids: torch.Tensor,
               attention_mask: torch.Tensor | None,
               prefix_lengths: torch.Tensor | None = None) -> torch.Tensor:
    """(B, T) the tokens a row predicts: its ids, pads and each piece's first token ignored,
    and the prefix's tokens where ``prefix_lengths`` (B,) are given."""
    labels = input_ids if attention_mask is None else input_ids.masked_fill(~attention_mask.bool(),
                                                                            IGNORE)
    if prefix_lengths is not None:
        positions = torch.arange(labels.shape[1], device=labels.device)  # (T,)
        labels = labels.masked_fill(positions < prefix_lengths[:, None], IGNORE)
    return document_labels(labels, document_ids)


def forward_of(kind: str, model: nn.Module) -> nn.Module:
    """The engine of ``kind``'s pretraining around ``model``."""
    engines = {"decoder": NextTokenForward, "encoder-decoder": SpanForward}
    return engines.get(kind, PretrainingForward)(model)


def engine_inputs(kind: str, local: Mapping[str, torch.Tensor],
                  mask: torch.Tensor | None) -> tuple[torch.Tensor | None, ...]:
    """The engine's arguments from a batch on the device (``mask``: its attention mask, or
    None when no token is padding)."""
    if kind == "decoder":  # prefix_lengths: the PrefixLM's rows only
        return local["input_ids"], local["document_ids"], mask, local.get("prefix_lengths")
    if kind == "encoder-decoder":
        return local["input_ids"], mask, local["labels"], local["decoder_attention_mask"]
    return (local["input_ids"], local["token_type_ids"], mask, local["mlm_labels"],
            local["nsp_labels"])


def token_targets(kind: str, micro: Sequence[Mapping[str, torch.Tensor]]) -> int:
    """The token targets of a step's micro-batches, counted on the host (at least 1)."""
    if kind == "decoder":
        total = sum(int((lm_targets(b["input_ids"], b["document_ids"], b["attention_mask"],
                                    b.get("prefix_lengths"))[:, 1:] != IGNORE).sum())
                    for b in micro)
    elif kind == "encoder-decoder":
        total = sum(int((b["labels"] != IGNORE).sum()) for b in micro)
    else:
        total = sum(int((b["mlm_labels"] != IGNORE).sum()) for b in micro)
    return max(1, total)
