"""transformers classes over the native folnet models (same modules, same weight names).

Each class builds the native model of its kind and head and adopts its submodules, so
model.safetensors is the native one: a directory saved by `folnet.save_pretrained` loads here
and one saved here loads in `folnet.from_pretrained`. As transformers' own encoders do, the
encoder's head classes hold the base model, `FolnetModel`, under ``base_model_prefix``
(``encoder``: the native stack's own name, so their keys are the native ``encoder.*`` and the
head's); `FolnetModel` itself holds the stack's modules, and writes them under ``encoder.``
as the native model does (transformers strips that prefix where it loads one). The forward
takes transformers' argument names and order (``input_ids, attention_mask, token_type_ids,
..., labels``) and returns transformers' output classes.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from folnet.arch import model_from_config
from folnet.arch.heads import classification_loss
from folnet.hf.config import FolnetConfig
from folnet.hf.outputs import (
    FolnetForPreTrainingOutput,
    FolnetMaskedLMOutput,
    FolnetModelOutput,
    FolnetMultipleChoiceModelOutput,
    FolnetQuestionAnsweringModelOutput,
    FolnetSequenceClassifierOutput,
    FolnetTokenClassifierOutput,
)
from folnet.hf.pretrained import FolnetPreTrainedModel, states


class FolnetModel(FolnetPreTrainedModel):
    """The bare encoder (``AutoModel``), and the base model of the encoder's head classes
    (their ``encoder``, ``model.base_model``); ``output_relations=True`` adds the final binary
    stream (and, with ``output_hidden_states``, the binary stream after every layer).

    Its modules are the native stack's (``atoms``, ``layers``, ``pool``); saved, they are
    written under ``encoder.`` as the native model writes them, so a folder saved here is a
    native one, and a head class loads its base weights from it."""

    def _owner(self, native: nn.Module) -> nn.Module:
        return native.encoder

    def _children(self, config: FolnetConfig, native: nn.Module
                  ) -> Iterator[tuple[str, nn.Module]]:
        return native.encoder.named_children()

    def _weights_as_saved(self) -> dict[str, torch.Tensor]:
        return {f"{self.base_model_prefix}.{k}": v for k, v in self.state_dict().items()}

    def own_name(self, saved: str) -> str:
        head = f"{self.base_model_prefix}."
        return saved[len(head):] if saved.startswith(head) else saved

    @classmethod
    def over(cls, config: FolnetConfig, native: nn.Module) -> FolnetModel:
        """The base model of a head class: a `FolnetModel` over the stack of ``native`` (the
        same modules; its own native model, built on the meta device, reads that stack)."""
        with torch.device("meta"):
            bare = model_from_config(native.cfg)
        bare.encoder = native.encoder
        return cls(config, native=bare)

    def forward(self, input_ids=None, attention_mask=None, token_type_ids=None,
                output_attentions: bool | None = None, output_hidden_states: bool | None = None,
                output_relations: bool | None = None, return_dict: bool | None = None,
                inputs_embeds: torch.Tensor | None = None, **kwargs: Any):
        out = self._encoder_forward(input_ids, attention_mask, token_type_ids, inputs_embeds,
                                    output_attentions=output_attentions,
                                    output_hidden_states=output_hidden_states,
                                    output_relations=output_relations)
        return self._returned(FolnetModelOutput(
            last_hidden_state=out.sequence_output, pooler_output=out.pooled_output,
            relation_output=out.relation_output, relation_states=out.relation_states,
            **states(out)), return_dict)


class _EncoderHead(FolnetPreTrainedModel):
    """An encoder head class: the native model's modules, its stack as a `FolnetModel`."""

    base_class = FolnetModel


class FolnetForPreTraining(_EncoderHead):
    """MLM (tied to the word embedding) + NSP/SOP (``AutoModelForPreTraining``)."""

    head = "pretraining"

    def forward(self, input_ids=None, attention_mask=None, token_type_ids=None, labels=None,
                next_sentence_label=None, output_attentions: bool | None = None,
                output_hidden_states: bool | None = None, return_dict: bool | None = None,
                inputs_embeds: torch.Tensor | None = None, **kwargs: Any):
        out = self._encoder_forward(input_ids, attention_mask, token_type_ids, inputs_embeds,
                                    mlm_labels=labels, nsp_labels=next_sentence_label,
                                    output_attentions=output_attentions,
                                    output_hidden_states=output_hidden_states)
        return self._returned(FolnetForPreTrainingOutput(out.loss, out.mlm_logits, out.nsp_logits,
                                                      **states(out)), return_dict)


class FolnetForMaskedLM(_EncoderHead):
    """MLM head tied to the word embedding (``AutoModelForMaskedLM``); ``labels`` as the
    collators give them (-100 where nothing is predicted)."""

    head = "mlm"

    def forward(self, input_ids=None, attention_mask=None, token_type_ids=None, labels=None,
                output_attentions: bool | None = None, output_hidden_states: bool | None = None,
                return_dict: bool | None = None, inputs_embeds: torch.Tensor | None = None,
                **kwargs: Any):
        out = self._encoder_forward(input_ids, attention_mask, token_type_ids, inputs_embeds,
                                    mlm_labels=labels, output_attentions=output_attentions,
                                    output_hidden_states=output_hidden_states)
        return self._returned(FolnetMaskedLMOutput(loss=out.loss, logits=out.mlm_logits,
                                                   **states(out)), return_dict)


def problem_type(config: FolnetConfig, labels: torch.Tensor) -> str:
    """``config.problem_type`` as BERT resolves it: when unset, regression for one label, else
    single-label for integer labels and multi-label for float ones -- then stored."""
    if config.problem_type is None:
        config.problem_type = (
            "regression" if config.num_labels == 1 else
            "multi_label_classification" if labels.is_floating_point() else
            "single_label_classification")
    return config.problem_type


class FolnetForSequenceClassification(_EncoderHead):
    """Dropout + Linear on the pooled token 0 (``self.classifier``, which the forward reads:
    a replaced head or PEFT's trainable copy takes effect); the loss by ``problem_type``
    (`folnet.arch.heads.classification_loss`; unset: regression (MSE) for one label,
    cross-entropy for integer labels, binary cross-entropy for float multi-label targets)."""

    head = "classification"

    def forward(self, input_ids=None, attention_mask=None, token_type_ids=None, labels=None,
                output_attentions: bool | None = None, output_hidden_states: bool | None = None,
                return_dict: bool | None = None, inputs_embeds: torch.Tensor | None = None,
                **kwargs: Any):
        out = self._encoder_forward(input_ids, attention_mask, token_type_ids, inputs_embeds,
                                    output_attentions=output_attentions,
                                    output_hidden_states=output_hidden_states)
        loss = None
        if labels is not None:
            labels = torch.as_tensor(labels, device=out.logits.device)
            loss = classification_loss(out.logits, labels, problem_type(self.config, labels))
        return self._returned(FolnetSequenceClassifierOutput(loss=loss, logits=out.logits,
                                                             **states(out)), return_dict)


class FolnetForMultipleChoice(_EncoderHead):
    """One score per choice; inputs (batch, choices, tokens)."""

    head = "multiple-choice"

    def forward(self, input_ids=None, attention_mask=None, token_type_ids=None, labels=None,
                output_attentions: bool | None = None, output_hidden_states: bool | None = None,
                return_dict: bool | None = None, inputs_embeds: torch.Tensor | None = None,
                **kwargs: Any):
        return self._labelled(FolnetMultipleChoiceModelOutput, input_ids, attention_mask,
                              token_type_ids, labels, output_attentions, output_hidden_states,
                              return_dict, inputs_embeds)


class FolnetForQuestionAnswering(_EncoderHead):
    """Span start and end logits per token."""

    head = "qa"

    def forward(self, input_ids=None, attention_mask=None, token_type_ids=None,
                start_positions=None, end_positions=None, output_attentions: bool | None = None,
                output_hidden_states: bool | None = None, return_dict: bool | None = None,
                inputs_embeds: torch.Tensor | None = None, **kwargs: Any):
        out = self._encoder_forward(input_ids, attention_mask, token_type_ids, inputs_embeds,
                                    start_positions=start_positions, end_positions=end_positions,
                                    output_attentions=output_attentions,
                                    output_hidden_states=output_hidden_states)
        return self._returned(FolnetQuestionAnsweringModelOutput(
            loss=out.loss, start_logits=out.start_logits, end_logits=out.end_logits,
            **states(out)), return_dict)


class FolnetForTokenClassification(_EncoderHead):
    """One label per token (-100 ignored)."""

    head = "token-classification"

    def forward(self, input_ids=None, attention_mask=None, token_type_ids=None, labels=None,
                output_attentions: bool | None = None, output_hidden_states: bool | None = None,
                return_dict: bool | None = None, inputs_embeds: torch.Tensor | None = None,
                **kwargs: Any):
        out = self._encoder_forward(input_ids, attention_mask, token_type_ids, inputs_embeds,
                                    labels=labels,
                                    output_attentions=output_attentions,
                                    output_hidden_states=output_hidden_states)
        return self._returned(FolnetTokenClassifierOutput(loss=out.loss, logits=out.logits,
                                                 **states(out)), return_dict)
