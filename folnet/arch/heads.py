"""Task heads, looked up by name (docs/design.md section 3 for the released ones).

Every classification-style loss is `folnet.arch.objectives.token_cross_entropy`: labels of -100
are ignored, and a batch with no label left gives a loss of 0 (not NaN). A head declares the
kinds of model it fits, the modules it adds to the model -- registered
under the names given, which are the checkpoints' key prefixes (``mlm.*``, ``nsp.*``,
``classifier.*``, ``qa.*``, ``lm.*``) -- and how it turns the stack's outputs into logits and
losses. `register_head` adds one; `get_head` lists the names that fit a kind on a miss.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from folnet.arch.config import ModelConfig
from folnet.arch.inputs import check_labels
from folnet.arch.objectives import token_cross_entropy
from folnet.arch.outputs import FolnetOutput
from folnet.errors import FolnetError, choices
from folnet.ops.kernels import layer_norm
from folnet.ops.kernels.device import kernel_device
from folnet.tracing import traced


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
        h = layer_norm(F.gelu(self.transform(hidden)), self.cfg.D1, self.cfg.layer_norm_eps)
        # (..., V): the padded vocabulary's extra rows are never predicted
        return F.linear(h, self._word.weight, self.bias)[..., : self.cfg.vocab_size]


class PoolerClassifier(nn.Module):
    """Dropout -> Linear on the pooled output (sequence classification / regression / NSP)."""

    def __init__(self, d1: int, num_labels: int, dropout: float):
        super().__init__()
        self.dropout = nn.Dropout(dropout)
        self.linear = nn.Linear(d1, num_labels)

    def forward(self, pooled: torch.Tensor) -> torch.Tensor:
        return self.linear(self.dropout(pooled))


def classification_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """The loss of sequence-classification logits (B, C), the problem told by the labels' form
    as transformers tells it: one output is regression (MSE against float targets (B,)),
    integer labels (B,) are single-label (cross-entropy, -100 ignored), float labels (B, C)
    are multi-label (binary cross-entropy with logits, one yes/no per class). Float labels
    for several classes used to go to the cross-entropy, which read them as a distribution
    over the classes -- another loss, silently."""
    if logits.shape[-1] == 1:  # regression
        return F.mse_loss(logits.squeeze(-1).float(), labels.float())
    if labels.is_floating_point():
        if tuple(labels.shape) != tuple(logits.shape):
            raise FolnetError(f"labels: float labels are multi-label targets, one per class, "
                              f"and must have the logits' shape {tuple(logits.shape)}, got "
                              f"{tuple(labels.shape)} (single-label classes are integers)")
        return F.binary_cross_entropy_with_logits(logits.float(), labels.float())
    return token_cross_entropy(logits, check_labels(labels, tuple(logits.shape[:1])))


def mlm_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Cross-entropy over the positions whose label is not -100; 0 when there are none (a
    batch in which no token was masked: see `token_cross_entropy`)."""
    return token_cross_entropy(logits.flatten(0, -2), labels.flatten())


def gather_masked(hidden: torch.Tensor, labels: torch.Tensor, slots: int | None = None
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """The hidden states and labels of the predicted positions only.

    The vocabulary projection is the largest matrix product of a small FOLNet; computing it for
    the ~15% masked positions instead of every token saves most of it. ``slots`` None: exactly
    the predicted positions, ``(N, D1)`` and ``(N,)`` -- N is read on the host, a sync on an
    accelerator and a graph break under torch.compile. ``slots`` P: on an accelerator and
    while tracing, P positions per sequence, its predicted ones first (in order), then
    unpredicted ones whose label is -100, ``(B*P, D1)`` and ``(B*P,)`` -- static shapes, no
    sync, and the same loss, since every loss here ignores -100 (BERT's
    ``max_predictions_per_seq``); on a CPU (`folnet.ops.kernels.device.kernel_device`), where
    the host is the device and reading N costs nothing, the exact gather still: fewer rows of
    the vocabulary projection, and the bits CPU runs always had. A row may not predict more
    than P tokens: checked where input values are (`folnet.arch.inputs.values_checked`).
    """
    if slots is None or (kernel_device(hidden.device) == "cpu" and not traced()):
        where = labels != -100
        return hidden[where], labels[where]
    slots = min(slots, labels.shape[1])
    # (B, P): a stable sort puts each row's predicted positions first, in order
    order = (labels == -100).to(torch.int8).argsort(dim=1, stable=True)[:, :slots]
    rows = hidden.gather(1, order.unsqueeze(-1).expand(-1, -1, hidden.shape[-1]))  # (B, P, D1)
    return rows.flatten(0, 1), labels.gather(1, order).flatten()


def check_slots(labels: torch.Tensor, slots: int) -> None:
    """Refuse labels (B, T) that predict more than ``slots`` tokens in a row: gathered into
    ``slots`` positions, the rest would be dropped from the loss."""
    most = int((labels != -100).sum(1).max()) if labels.numel() else 0
    if most > slots:
        raise FolnetError(f"mlm_labels: a row predicts {most} tokens, more than the model's "
                          f"gather_mlm = {slots} predictions per sequence; raise gather_mlm "
                          f"(or the masking's max_predictions) to at least {most}")


@dataclass
class Targets:
    """The labels a forward pass may get, and how the MLM logits are wanted."""

    labels: torch.Tensor | None = None
    mlm_labels: torch.Tensor | None = None
    nsp_labels: torch.Tensor | None = None
    start_positions: torch.Tensor | None = None
    end_positions: torch.Tensor | None = None
    gather_mlm: bool | int = False  # True: the predicted positions; P: P slots per row
    values: bool = False  # the labels' values are checked (`folnet.arch.inputs`)


class Head:
    """A head: ``build`` gives its modules by attribute name, ``forward`` fills the output's
    fields from them and returns its losses."""

    name = "?"
    kinds: tuple[str, ...] = ("encoder",)
    multiple_choice = False  # inputs (batch, choices, tokens)

    def build(self, cfg: ModelConfig, num_labels: int, word: nn.Embedding
              ) -> dict[str, nn.Module]:
        raise NotImplementedError

    def forward(self, model: nn.Module, out: Any, targets: Targets) -> list[torch.Tensor]:
        raise NotImplementedError


class _MaskedLM(Head):
    name = "mlm"

    def build(self, cfg, num_labels, word):
        return {"mlm": MLMHead(cfg, word)}

    def forward(self, model, out: FolnetOutput, targets):
        seq, labels = out.sequence_output, targets.mlm_labels
        if labels is None:
            out.mlm_logits = model.mlm(seq)
            return []
        check_labels(labels, tuple(seq.shape[:2]), "mlm_labels")
        gather = targets.gather_mlm
        if gather is not False:
            slots = None if gather is True else gather
            if slots is not None and targets.values:
                check_slots(labels, slots)
            seq, labels = gather_masked(seq, labels, slots)
            out.mlm_labels = labels
        out.mlm_logits = model.mlm(seq)
        return [mlm_loss(out.mlm_logits, labels)]


class _Pretraining(_MaskedLM):
    name = "pretraining"

    def build(self, cfg, num_labels, word):
        return {**super().build(cfg, num_labels, word), "nsp": nn.Linear(cfg.D1, 2)}

    def forward(self, model, out, targets):
        losses = super().forward(model, out, targets)
        out.nsp_logits = model.nsp(out.pooled_output)
        if targets.nsp_labels is not None:
            losses.append(token_cross_entropy(out.nsp_logits, targets.nsp_labels))
        return losses


class _Classification(Head):
    name = "classification"

    def build(self, cfg, num_labels, word):
        return {"classifier": PoolerClassifier(cfg.D1, num_labels, cfg.dropout)}

    def forward(self, model, out, targets):
        out.logits = model.classifier(out.pooled_output)  # (B, C)
        labels = targets.labels
        return [] if labels is None else [classification_loss(out.logits, labels)]


class _MultipleChoice(Head):
    name = "multiple-choice"
    multiple_choice = True

    def build(self, cfg, num_labels, word):
        return {"classifier": PoolerClassifier(cfg.D1, 1, cfg.dropout)}

    def forward(self, model, out, targets):
        out.logits = model.classifier(out.pooled_output).squeeze(-1)  # (B, C)
        labels = targets.labels
        return [] if labels is None else [token_cross_entropy(out.logits, labels)]


class _QuestionAnswering(Head):
    name = "qa"

    def build(self, cfg, num_labels, word):
        return {"qa": nn.Linear(cfg.D1, 2)}

    def forward(self, model, out, targets):
        out.logits = model.qa(out.sequence_output)  # (B, T, 2)
        out.start_logits, out.end_logits = out.logits.unbind(-1)
        if targets.start_positions is None or targets.end_positions is None:
            return []
        return [0.5 * (token_cross_entropy(out.start_logits, targets.start_positions)
                       + token_cross_entropy(out.end_logits, targets.end_positions))]


class _TokenClassification(Head):
    name = "token-classification"

    def build(self, cfg, num_labels, word):
        return {"dropout": nn.Dropout(cfg.dropout), "classifier": nn.Linear(cfg.D1, num_labels)}

    def forward(self, model, out, targets):
        out.logits = model.classifier(model.dropout(out.sequence_output))  # (B, T, C)
        if targets.labels is None:
            return []
        return [token_cross_entropy(out.logits.flatten(0, 1), targets.labels.flatten())]


class _LanguageModel(Head):
    """The text-to-text models' LM head: the MLM head's transform, decoder tied to the word
    embedding; the models compute their own next-token losses."""

    name = "lm"
    kinds = ("decoder", "encoder-decoder")

    def build(self, cfg, num_labels, word):
        return {"lm": MLMHead(cfg, word)}

    def forward(self, model, out, targets):
        out.logits = model.lm(out.sequence_output)  # (B, T, V)
        return []


HEADS: dict[str, Head] = {}


def register_head(head: Head) -> Head:
    """Add a head under ``head.name`` (a duplicate name is refused)."""
    if head.name in HEADS:
        raise FolnetError(f"head {head.name!r} is already registered")
    HEADS[head.name] = head
    return head


for _head in (_Pretraining(), _MaskedLM(), _Classification(), _MultipleChoice(),
              _QuestionAnswering(), _TokenClassification(), _LanguageModel()):
    register_head(_head)


def head_names(kind: str) -> tuple[str, ...]:
    """The heads a kind of model can carry."""
    return tuple(name for name, head in HEADS.items() if kind in head.kinds)


def get_head(name: str, kind: str) -> Head:
    """The head ``name`` for a model of ``kind``; a miss lists what fits."""
    head = HEADS.get(name)
    if head is None or kind not in head.kinds:
        raise FolnetError(f"head {name!r} is unknown for kind {kind!r}; use None or "
                          f"{choices(head_names(kind))}")
    return head
