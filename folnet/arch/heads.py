"""Task heads, looked up by name (docs/design.md section 3 for the released ones).

Every classification-style loss is `folnet.arch.objectives.token_cross_entropy`: labels of -100
are ignored, and a batch with no label left gives a loss of 0 (not NaN). A head declares the
kinds of model it fits, the modules it adds to the model -- registered
under the names given, which are the checkpoints' key prefixes (``mlm.*``, ``nsp.*``,
``classifier.*``, ``qa.*``, ``lm.*``) -- and how it turns the stack's outputs into logits and
losses. The built-in heads are registered here in the one table of heads,
`folnet.arch.head_table.HEADS`, which also holds what the rest of folnet needs to know about
each (its `folnet.hf` class, whether finetuning uses it, ...); `register_head` adds one,
`unregister_head` removes one of yours, `get_head` lists the names that fit a kind on a miss.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from folnet.arch.config import ModelConfig
from folnet.arch.head_table import HEADS, Head, register_head
from folnet.arch.inputs import check_labels
from folnet.arch.objectives import token_cross_entropy
from folnet.arch.outputs import FolnetOutput
from folnet.errors import FolnetError
from folnet.ops.primitives import layer_norm
from folnet.ops.primitives.device import kernel_device
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


def classification_loss(logits: torch.Tensor, labels: torch.Tensor,
                        problem_type: str | None = None) -> torch.Tensor:
    """The loss of sequence-classification logits (B, C). ``problem_type`` as transformers
    names it, or None to tell it by the labels' form as transformers does: one output is
    regression (MSE against float targets), integer labels (B,) are single-label
    (cross-entropy, -100 ignored), float labels (B, C) are multi-label (binary cross-entropy
    with logits, one yes/no per class). Told by their form, float labels for several classes
    never go to the cross-entropy, which would read them as a distribution over the classes --
    another loss, silently."""
    if problem_type is None:
        problem_type = ("regression" if logits.shape[-1] == 1 else
                        "multi_label_classification" if labels.is_floating_point() else
                        "single_label_classification")
    if problem_type == "regression":
        out = logits.squeeze(-1) if logits.shape[-1] == 1 else logits
        if labels.numel() != out.numel():
            raise FolnetError(f"labels: regression targets are one number per output, "
                              f"{tuple(out.shape)} here, got {tuple(labels.shape)}")
        return F.mse_loss(out.float(), labels.float().reshape(out.shape))
    if problem_type == "multi_label_classification":
        if tuple(labels.shape) != tuple(logits.shape):
            raise FolnetError(f"labels: multi-label targets are one float per class and must "
                              f"have the logits' shape {tuple(logits.shape)}, got "
                              f"{tuple(labels.shape)} (single-label classes are integers)")
        return F.binary_cross_entropy_with_logits(logits.float(), labels.float())
    if problem_type != "single_label_classification":
        raise FolnetError(f"problem_type {problem_type!r} is unknown; use one of "
                          f"{PROBLEM_TYPES}")
    if labels.is_floating_point():
        raise FolnetError(f"labels: single-label classes are integers (B,), got "
                          f"{labels.dtype} labels")
    return token_cross_entropy(logits, check_labels(labels, tuple(logits.shape[:1])))


#: transformers' problem types of a sequence classifier (``config.problem_type``).
PROBLEM_TYPES = ("regression", "single_label_classification", "multi_label_classification")


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
    ``max_predictions_per_seq``); on a CPU (`folnet.ops.primitives.device.kernel_device`), where
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


class _MaskedLM(Head):
    name = "mlm"
    hf_classes: ClassVar[Mapping[str, str]] = {"encoder": "FolnetForMaskedLM"}
    tied = True

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
    hf_classes: ClassVar[Mapping[str, str]] = {"encoder": "FolnetForPreTraining"}

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
    hf_classes: ClassVar[Mapping[str, str]] = {"encoder": "FolnetForSequenceClassification"}
    task_head = True
    task_kinds = ("classification", "regression")

    def build(self, cfg, num_labels, word):
        return {"classifier": PoolerClassifier(cfg.D1, num_labels, cfg.dropout)}

    def forward(self, model, out, targets):
        out.logits = model.classifier(out.pooled_output)  # (B, C)
        labels = targets.labels
        return [] if labels is None else [classification_loss(out.logits, labels)]


class _MultipleChoice(Head):
    name = "multiple-choice"
    multiple_choice = True
    hf_classes: ClassVar[Mapping[str, str]] = {"encoder": "FolnetForMultipleChoice"}
    task_head = True

    def build(self, cfg, num_labels, word):
        return {"classifier": PoolerClassifier(cfg.D1, 1, cfg.dropout)}

    def forward(self, model, out, targets):
        out.logits = model.classifier(out.pooled_output).squeeze(-1)  # (B, C)
        labels = targets.labels
        return [] if labels is None else [token_cross_entropy(out.logits, labels)]


class _QuestionAnswering(Head):
    name = "qa"
    hf_classes: ClassVar[Mapping[str, str]] = {"encoder": "FolnetForQuestionAnswering"}
    task_head = True
    task_kinds = ("qa",)

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
    hf_classes: ClassVar[Mapping[str, str]] = {"encoder": "FolnetForTokenClassification"}
    task_head = True

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
    hf_classes: ClassVar[Mapping[str, str]] = {"decoder": "FolnetForCausalLM",
                                               "encoder-decoder": "FolnetForConditionalGeneration"}
    tied = True

    def build(self, cfg, num_labels, word):
        return {"lm": MLMHead(cfg, word)}

    def forward(self, model, out, targets):
        out.logits = model.lm(out.sequence_output)  # (B, T, V)
        return []


for _head in (_Pretraining(), _MaskedLM(), _Classification(), _MultipleChoice(),
              _QuestionAnswering(), _TokenClassification(), _LanguageModel()):
    register_head(_head)
#: The heads folnet ships, which `unregister_head` keeps.
BUILTIN_HEADS: tuple[str, ...] = tuple(HEADS)


def unregister_head(name: str) -> Head:
    """Remove the registered head ``name`` (not a built-in one); returns it."""
    if name in BUILTIN_HEADS:
        raise FolnetError(f"head {name!r} is built in and cannot be unregistered")
    if name not in HEADS:
        custom = [n for n in HEADS if n not in BUILTIN_HEADS]
        raise FolnetError(f"head {name!r} is not registered; registered heads of yours: "
                          f"{custom or 'none'}")
    return HEADS.pop(name)
