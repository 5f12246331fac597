"""transformers classes over the native folnet models (same modules, same state-dict keys).

Each class builds the native model of its kind and head and adopts its submodules under their
own names, so the state dict, and model.safetensors, is the native one: a directory saved by
`folnet.save_pretrained` loads here and one saved here loads in `folnet.from_pretrained`. The
forward takes transformers' argument names and order (``input_ids, attention_mask,
token_type_ids, ..., labels``) and returns transformers' output classes.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import nn
from transformers import PreTrainedModel
from transformers.modeling_outputs import (
    MaskedLMOutput,
    MultipleChoiceModelOutput,
    QuestionAnsweringModelOutput,
    SequenceClassifierOutput,
    TokenClassifierOutput,
)
from transformers.utils import ModelOutput

from folnet.arch import model_from_config
from folnet.arch.models.base import initialise
from folnet.checksums import verify_model_dir, write_model_manifest
from folnet.errors import FolnetError
from folnet.hf.config import FolnetConfig

try:  # transformers 5: initialisers that skip weights already loaded
    from transformers import initialization as init
except ImportError:  # pragma: no cover
    from torch.nn import init


#: The heads whose decoder is the word embedding itself.
TIED_HEADS = ("mlm", "pretraining", "lm")


class FolnetPreTrainedModel(PreTrainedModel):
    """The native folnet model of the class's kind and head, as a transformers model."""

    config_class = FolnetConfig
    base_model_prefix = "encoder"
    main_input_name = "input_ids"
    supports_gradient_checkpointing = True
    kind: ClassVar[str] = "encoder"
    head: ClassVar[str | None] = None

    def __init__(self, config: FolnetConfig):
        super().__init__(config)
        cfg = config.model_config()
        if cfg.kind != self.kind:
            raise FolnetError(f"{type(self).__name__} is a {self.kind!r} model, the config "
                              f"describes a {cfg.kind!r} one")
        native = model_from_config(cfg, head=self.head, num_labels=config.num_labels)
        for name, child in native.named_children():  # adopted: the native keys, shared
            self.add_module(name, child)
        object.__setattr__(self, "native", native)  # not a submodule: no second key
        config.head = native.head
        config.tie_word_embeddings = native.head in TIED_HEADS
        self.post_init()

    def __setattr__(self, name: str, value: Any) -> None:
        """A module set under an adopted name (``model.classifier = head``, PEFT's trainable
        copy of a head in ``modules_to_save``, a wrapped ``encoder``) is set on the native
        model too, whose forward reads it: the two must never hold different modules."""
        super().__setattr__(name, value)
        native = self.__dict__.get("native")
        if native is not None and isinstance(value, nn.Module) and name in native._modules:
            setattr(native, name, value)

    @classmethod
    def from_pretrained(cls, *args: Any, **kwargs: Any):
        """transformers' loading, then every weight copied out of the file mapping: safetensors
        offsets leave mapped tensors unaligned, and the CPU matrix kernels then take other code
        paths that round differently (measured: ~1e-7 off the native model's outputs). With
        ``output_loading_info=True`` the answer is (model, info), as transformers gives it."""
        source = args[0] if args else kwargs.get("pretrained_model_name_or_path")
        if isinstance(source, (str, os.PathLike)) and os.path.isdir(source):
            verify_model_dir(source)  # config, weights and tokenizer against checksums.json
        loaded = super().from_pretrained(*args, **kwargs)
        model = loaded[0] if isinstance(loaded, tuple) else loaded
        with torch.no_grad():
            for tensor in (*model.parameters(), *model.buffers()):
                tensor.data = tensor.data.clone()
        return loaded

    def save_pretrained(self, save_directory: str | os.PathLike[str], *args: Any,
                        is_main_process: bool = True, **kwargs: Any) -> None:
        """transformers' saving, then the directory's ``checksums.json`` over its model and
        tokenizer files (`folnet.checksums.write_model_manifest`), so that loading it checks
        them instead of warning that folnet's own fresh directory has no manifest."""
        super().save_pretrained(save_directory, *args, is_main_process=is_main_process,
                                **kwargs)
        if is_main_process:
            write_model_manifest(save_directory)

    def train(self, mode: bool = True) -> FolnetPreTrainedModel:
        super().train(mode)
        self.native.training = mode
        return self

    def _init_weights(self, module: nn.Module) -> None:
        """folnet's init: N(0, initializer_range) weights and embeddings, zero biases."""
        initialise(module.named_parameters(recurse=False),
                   float(self.config.model["initializer_range"]),
                   zeros=init.zeros_, normal=init.normal_)

    def get_input_embeddings(self) -> nn.Module:
        return self.native.word_embedding()

    def set_input_embeddings(self, value: nn.Module) -> None:
        """Read (and, for the tied LM heads, predict) through ``value``, a module of the current
        embedding's shape; another vocabulary size is ``resize_token_embeddings``'."""
        self.native.set_word_embedding(value)

    def get_output_embeddings(self) -> nn.Module | None:
        """The LM/MLM head's decoder: the word embedding itself (tied by construction, so
        ``get_output_embeddings().weight is get_input_embeddings().weight``); None for heads
        that do not predict tokens."""
        return self.native.word_embedding() if self.native.head in TIED_HEADS else None

    def resize_token_embeddings(self, new_num_tokens: int | None = None,
                                pad_to_multiple_of: int | None = None,
                                mean_resizing: bool = True) -> nn.Embedding:
        """Grow or shrink the vocabulary to ``new_num_tokens`` (the word embedding, its tied
        heads and the config; `folnet.arch.vocab`); new rows as transformers initialises them
        (``mean_resizing``). The embedding keeps folnet's padding (rows rounded up to a
        multiple of 8), so ``pad_to_multiple_of`` is refused."""
        if pad_to_multiple_of is not None:
            raise FolnetError(f"pad_to_multiple_of={pad_to_multiple_of!r}: a folnet vocabulary "
                              f"is always padded to a multiple of 8 rows; leave it None")
        if new_num_tokens is None:
            return self.get_input_embeddings()
        embedding = self.native.resize_token_embeddings(new_num_tokens,
                                                        mean_resizing=mean_resizing)
        self.config.model = self.native.cfg.to_dict()
        if self.native.head == "lm":
            self.config.num_labels = new_num_tokens
        return embedding

    @property
    def is_activation_checkpointing(self) -> bool:
        """Whether the layers are recomputed in the backward pass (folnet's own flag)."""
        return bool(self.native.checkpointing)

    @property
    def is_gradient_checkpointing(self) -> bool:
        """The same flag under the name transformers before 5.24 reads (it looked for a
        ``gradient_checkpointing`` attribute on submodules, which folnet's layers do not have)."""
        return self.is_activation_checkpointing

    def activation_checkpointing_enable(self, *args: Any, **kwargs: Any) -> None:
        self.native.set_activation_checkpointing(True)

    def activation_checkpointing_disable(self) -> None:
        self.native.set_activation_checkpointing(False)

    gradient_checkpointing_enable = activation_checkpointing_enable
    gradient_checkpointing_disable = activation_checkpointing_disable

    def _asked(self, output_attentions: bool | None, output_hidden_states: bool | None,
               output_relations: bool | None) -> dict[str, Any]:
        """What a call asks the native model to return; None: the config's setting."""
        def pick(value: bool | None, name: str) -> bool:
            return bool(getattr(self.config, name, False) if value is None else value)

        return {"output_attentions": pick(output_attentions, "output_attentions"),
                "output_hidden_states": pick(output_hidden_states, "output_hidden_states"),
                "output_relations": output_relations}

    def _labelled(self, output_cls: type, input_ids, attention_mask, token_type_ids, labels,
                  output_attentions, output_hidden_states, return_dict):
        """A head with one logits tensor and ``labels`` (classification, multiple choice), its
        outputs in ``output_cls``."""
        out = self._encoder_forward(input_ids, attention_mask, token_type_ids, labels=labels,
                                    output_attentions=output_attentions,
                                    output_hidden_states=output_hidden_states)
        return self._returned(output_cls(loss=out.loss, logits=out.logits, **states(out)),
                           return_dict)

    def _returned(self, output: ModelOutput, return_dict: bool | None) -> ModelOutput | tuple:
        """``output`` as the caller asked for it: the ModelOutput, or its tuple of non-None
        fields with ``return_dict=False`` -- given to this call, or else the config's
        (``from_pretrained(..., return_dict=False)``), as transformers' own classes do."""
        wanted = self.config.return_dict if return_dict is None else return_dict
        return as_returned(output, wanted)

    def _encoder_forward(self, input_ids, attention_mask, token_type_ids, *,
                         output_attentions=None, output_hidden_states=None,
                         output_relations=None, **labels):
        return self.native(input_ids, token_type_ids=token_type_ids,
                           attention_mask=attention_mask, **labels,
                           **self._asked(output_attentions, output_hidden_states,
                                         output_relations))


@dataclass
class FolnetModelOutput(ModelOutput):
    """The bare encoder's outputs: final unary atoms, pooled token 0, final binary atoms (with
    ``output_relations=True``), and on request the per-layer states and the softmax operators'
    activated kernels (`folnet.arch.layer.stack.Record`)."""

    last_hidden_state: torch.Tensor | None = None  # (B, T, D1)
    pooler_output: torch.Tensor | None = None  # (B, D1)
    relation_output: torch.Tensor | None = None  # (B, T, T, D2)
    hidden_states: tuple[torch.Tensor, ...] | None = None  # L + 1 of (B, T, D1)
    attentions: tuple[dict[str, torch.Tensor], ...] | None = None  # per layer, by operator
    relation_states: tuple[torch.Tensor, ...] | None = None  # L + 1 of (B, T, T, D2)


@dataclass
class FolnetForPreTrainingOutput(ModelOutput):
    loss: torch.Tensor | None = None
    prediction_logits: torch.Tensor | None = None  # (B, T, V)
    seq_relationship_logits: torch.Tensor | None = None  # (B, 2)
    hidden_states: tuple[torch.Tensor, ...] | None = None
    attentions: tuple[dict[str, torch.Tensor], ...] | None = None


def states(out: Any) -> dict[str, Any]:
    """The per-layer fields of a native output, as transformers' outputs name them."""
    return {"hidden_states": out.hidden_states, "attentions": out.attentions}


def as_returned(output: ModelOutput, return_dict: bool | None) -> ModelOutput | tuple:
    """The output as transformers callers asked for it: the ModelOutput, or with
    ``return_dict=False`` its tuple of non-None fields."""
    return output if return_dict is not False else output.to_tuple()


class FolnetModel(FolnetPreTrainedModel):
    """The bare encoder (``AutoModel``); ``output_relations=True`` adds the final binary
    stream (and, with ``output_hidden_states``, the binary stream after every layer)."""

    def forward(self, input_ids=None, attention_mask=None, token_type_ids=None,
                output_attentions: bool | None = None, output_hidden_states: bool | None = None,
                output_relations: bool | None = None, return_dict: bool | None = None,
                **kwargs: Any):
        out = self._encoder_forward(input_ids, attention_mask, token_type_ids,
                                    output_attentions=output_attentions,
                                    output_hidden_states=output_hidden_states,
                                    output_relations=output_relations)
        return self._returned(FolnetModelOutput(
            out.sequence_output, out.pooled_output, out.relation_output, out.hidden_states,
            out.attentions, out.relation_states), return_dict)


class FolnetForPreTraining(FolnetPreTrainedModel):
    """MLM (tied to the word embedding) + NSP/SOP (``AutoModelForPreTraining``)."""

    head = "pretraining"

    def forward(self, input_ids=None, attention_mask=None, token_type_ids=None, labels=None,
                next_sentence_label=None, output_attentions: bool | None = None,
                output_hidden_states: bool | None = None, return_dict: bool | None = None,
                **kwargs: Any):
        out = self._encoder_forward(input_ids, attention_mask, token_type_ids,
                                    mlm_labels=labels, nsp_labels=next_sentence_label,
                                    output_attentions=output_attentions,
                                    output_hidden_states=output_hidden_states)
        return self._returned(FolnetForPreTrainingOutput(out.loss, out.mlm_logits, out.nsp_logits,
                                                      **states(out)), return_dict)


class FolnetForMaskedLM(FolnetPreTrainedModel):
    """MLM head tied to the word embedding (``AutoModelForMaskedLM``); ``labels`` as the
    collators give them (-100 where nothing is predicted)."""

    head = "mlm"

    def forward(self, input_ids=None, attention_mask=None, token_type_ids=None, labels=None,
                output_attentions: bool | None = None, output_hidden_states: bool | None = None,
                return_dict: bool | None = None, **kwargs: Any):
        out = self._encoder_forward(input_ids, attention_mask, token_type_ids,
                                    mlm_labels=labels, output_attentions=output_attentions,
                                    output_hidden_states=output_hidden_states)
        return self._returned(MaskedLMOutput(loss=out.loss, logits=out.mlm_logits, **states(out)),
                           return_dict)


#: transformers' problem types of a sequence classifier (``config.problem_type``).
PROBLEM_TYPES = ("regression", "single_label_classification", "multi_label_classification")


def check_problem_type(config: FolnetConfig, labels: torch.Tensor) -> None:
    """``config.problem_type`` as BERT resolves it -- when unset, regression for one label,
    else single-label for integer labels and multi-label for float ones, then stored -- and
    checked against what folnet's head computes for the labels given
    (`folnet.arch.heads.classification_loss`), so that the two can never disagree silently."""
    kind, n = config.problem_type, config.num_labels
    floating = labels.is_floating_point()
    if kind is None:
        kind = ("regression" if n == 1 else
                "multi_label_classification" if floating else "single_label_classification")
        config.problem_type = kind
    if kind not in PROBLEM_TYPES:
        raise FolnetError(f"problem_type {kind!r} is unknown; use one of {PROBLEM_TYPES}")
    wrong = {"regression": n != 1,
             "single_label_classification": n == 1 or floating,
             "multi_label_classification": n == 1 or not floating}[kind]
    if wrong:
        raise FolnetError(f"problem_type {kind!r} with num_labels={n} and {labels.dtype} labels: "
                          f"folnet computes regression for num_labels=1, single-label for "
                          f"integer labels (B,) and multi-label for float labels (B, "
                          f"num_labels)")


class FolnetForSequenceClassification(FolnetPreTrainedModel):
    """Dropout + Linear on the pooled token 0 (``self.classifier``, which the forward reads:
    a replaced head or PEFT's trainable copy takes effect); the loss by ``problem_type``:
    regression (MSE) for one label, cross-entropy for integer labels, binary cross-entropy
    for float multi-label targets."""

    head = "classification"

    def forward(self, input_ids=None, attention_mask=None, token_type_ids=None, labels=None,
                output_attentions: bool | None = None, output_hidden_states: bool | None = None,
                return_dict: bool | None = None, **kwargs: Any):
        if labels is not None:
            check_problem_type(self.config, torch.as_tensor(labels))
        return self._labelled(SequenceClassifierOutput, input_ids, attention_mask,
                              token_type_ids, labels, output_attentions, output_hidden_states,
                              return_dict)


class FolnetForMultipleChoice(FolnetPreTrainedModel):
    """One score per choice; inputs (batch, choices, tokens)."""

    head = "multiple-choice"

    def forward(self, input_ids=None, attention_mask=None, token_type_ids=None, labels=None,
                output_attentions: bool | None = None, output_hidden_states: bool | None = None,
                return_dict: bool | None = None, **kwargs: Any):
        return self._labelled(MultipleChoiceModelOutput, input_ids, attention_mask,
                              token_type_ids, labels, output_attentions, output_hidden_states,
                              return_dict)


class FolnetForQuestionAnswering(FolnetPreTrainedModel):
    """Span start and end logits per token."""

    head = "qa"

    def forward(self, input_ids=None, attention_mask=None, token_type_ids=None,
                start_positions=None, end_positions=None, output_attentions: bool | None = None,
                output_hidden_states: bool | None = None, return_dict: bool | None = None,
                **kwargs: Any):
        out = self._encoder_forward(input_ids, attention_mask, token_type_ids,
                                    start_positions=start_positions, end_positions=end_positions,
                                    output_attentions=output_attentions,
                                    output_hidden_states=output_hidden_states)
        return self._returned(QuestionAnsweringModelOutput(
            loss=out.loss, start_logits=out.start_logits, end_logits=out.end_logits,
            **states(out)), return_dict)


class FolnetForTokenClassification(FolnetPreTrainedModel):
    """One label per token (-100 ignored)."""

    head = "token-classification"

    def forward(self, input_ids=None, attention_mask=None, token_type_ids=None, labels=None,
                output_attentions: bool | None = None, output_hidden_states: bool | None = None,
                return_dict: bool | None = None, **kwargs: Any):
        out = self._encoder_forward(input_ids, attention_mask, token_type_ids, labels=labels,
                                    output_attentions=output_attentions,
                                    output_hidden_states=output_hidden_states)
        return self._returned(TokenClassifierOutput(loss=out.loss, logits=out.logits,
                                                 **states(out)), return_dict)
