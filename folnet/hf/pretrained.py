"""The base of folnet's transformers classes: `FolnetPreTrainedModel`, which builds the native
model of a class's kind and head and adopts its submodules (the same modules, the same weight
names), and `CheckpointedLayer`, the native layer as transformers' activation checkpointing
recomputes it. The head classes are in `folnet.hf.modeling` and `folnet.hf.text`, their base
models in `folnet.hf.modeling` (`FolnetModel`) and `folnet.hf.text_base`.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Iterator
from typing import Any, ClassVar

import torch
from torch import nn
from transformers import PreTrainedModel
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.utils import ModelOutput

from folnet.arch import model_from_config
from folnet.arch.layer.dual_stream import DualStreamLayer
from folnet.arch.models.base import initialise
from folnet.checksums import verify_model_dir, write_model_manifest
from folnet.errors import FolnetError
from folnet.hf.config import FolnetConfig
from folnet.hf.embeds import embeddings_given, ids_for
from folnet.hf.outputs import (
    attention_fields,
)

try:  # transformers 5: initialisers that skip weights already loaded
    from transformers import initialization as init
except ImportError:  # pragma: no cover
    from torch.nn import init

class CheckpointedLayer(DualStreamLayer, GradientCheckpointingLayer):
    """A `DualStreamLayer` that transformers' activation checkpointing recomputes
    (``model.activation_checkpointing_enable(activation_checkpointing_kwargs=...)``, the
    Trainer's ``gradient_checkpointing``): the same module, its class a transformers 5
    ``GradientCheckpointingLayer``. folnet's own runs checkpoint through the native flag
    (`folnet.arch.models.base.FolnetBase.set_activation_checkpointing`) instead."""

    def _get_name(self) -> str:
        return "DualStreamLayer"  # print(model) as the native model's


def checkpointable(native: nn.Module) -> None:
    """Make every layer of ``native`` a `CheckpointedLayer` in place: no module, parameter or
    state-dict key changes, only the class the layers' calls go through."""
    for module in native.modules():
        if type(module) is DualStreamLayer:
            module.__class__ = CheckpointedLayer


#: The heads whose decoder is the word embedding itself.
TIED_HEADS = ("mlm", "pretraining", "lm")


class FolnetPreTrainedModel(PreTrainedModel):
    """The native folnet model of the class's kind and head, as a transformers model."""

    config_class = FolnetConfig
    base_model_prefix = "encoder"
    main_input_name = "input_ids"
    supports_gradient_checkpointing = True
    # attn_implementation: "sdpa" (transformers' default) keeps folnet's own choice per
    # operator call -- the fused kernels of its backend list, torch SDPA among them
    # (`folnet.ops.backends.PRIORITY`); "eager" runs every operator on the einsum reference
    _supports_sdpa = True
    kind: ClassVar[str] = "encoder"
    head: ClassVar[str | None] = None
    #: the class of the base model held under ``base_model_prefix`` (None: this is one)
    base_class: ClassVar[Any] = None

    def __init__(self, config: FolnetConfig, native: nn.Module | None = None):
        super().__init__(config)
        if native is None:
            native = self._native(config)
        checkpointable(native)
        for name, child in self._children(config, native):  # adopted: shared with native
            self.add_module(name, child)
        object.__setattr__(self, "native", native)  # not a submodule: no second key
        object.__setattr__(self, "_adopted_from", self._owner(native))
        self.register_load_state_dict_pre_hook(_native_names_read)
        config.head = native.head
        config.tie_word_embeddings = native.head in TIED_HEADS
        self.post_init()

    def _native(self, config: FolnetConfig) -> nn.Module:
        """The native model of the class's kind and head that ``config`` describes."""
        cfg = config.model_config()
        if config._attn_implementation == "eager":  # the reference contraction, materialised
            cfg = cfg.replace(backend="einsum")
        if cfg.kind != self.kind:
            raise FolnetError(f"{type(self).__name__} is a {self.kind!r} model, the config "
                              f"describes a {cfg.kind!r} one")
        return model_from_config(cfg, head=self.head, num_labels=config.num_labels)

    def _owner(self, native: nn.Module) -> nn.Module:
        """The module whose children this class adopts (the native model itself, but for
        `FolnetModel`, which adopts its stack's)."""
        return native

    def _children(self, config: FolnetConfig, native: nn.Module
                  ) -> Iterator[tuple[str, nn.Module]]:
        """The submodules this class holds, by name: the native model's, the stack of an
        encoder head class as its base model (``base_class.over``)."""
        for name, child in self._owner(native).named_children():
            if self.base_class is not None and name == self.base_model_prefix:
                child = self.base_class.over(config, native)
            yield name, child

    def _weights_as_saved(self) -> dict[str, torch.Tensor] | None:
        """The state dict under the names model.safetensors holds (the native model's), where
        they are not this class's own; None: its own (`save_pretrained`)."""
        return None

    def own_name(self, saved: str) -> str:
        """This class's name of the weight the native model (and model.safetensors) calls
        ``saved`` (`_weights_as_saved` the other way)."""
        return saved

    def __setattr__(self, name: str, value: Any) -> None:
        """A module set under an adopted name (``model.classifier = head``, PEFT's trainable
        copy of a head in ``modules_to_save``, a wrapped ``encoder``) is set on the native
        model too, whose forward reads it: the two must never hold different modules."""
        super().__setattr__(name, value)
        owner = self.__dict__.get("_adopted_from")
        if owner is not None and isinstance(value, nn.Module) and name in owner._modules:
            # a base model set under ``encoder``: the native model reads its stack
            setattr(owner, name, value._adopted_from
                    if isinstance(value, FolnetPreTrainedModel) else value)

    @classmethod
    def from_pretrained(cls, *args: Any, **kwargs: Any):
        """transformers' loading, then every weight copied out of the file mapping: safetensors
        offsets leave mapped tensors unaligned, and the CPU matrix kernels then take other code
        paths that round differently, off the native model's outputs by a float32 rounding
        error (docs/results/measurements.md). With ``output_loading_info=True`` the answer is
        (model, info), as transformers gives it."""
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
        if kwargs.get("state_dict") is None:
            kwargs["state_dict"] = self._weights_as_saved()
        shared = self.config
        if self.base_model is self and shared.head is not None:
            # a head class's base model shares its config: what is saved here has no head
            self.config = copy.deepcopy(shared)
            self.config.head, self.config.tie_word_embeddings = None, False
        try:
            super().save_pretrained(save_directory, *args, is_main_process=is_main_process,
                                    **kwargs)
        finally:
            self.config = shared
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
        """Read (and, for the tied LM heads, predict) through ``value``
        (`folnet.arch.vocab.replace_word_embedding`: another shape sets the vocabulary)."""
        self.native.set_word_embedding(value)
        self.config.model = self.native.cfg.to_dict()

    def get_output_embeddings(self) -> nn.Module | None:
        """The LM/MLM head's decoder: the word embedding itself (tied by construction, so
        ``get_output_embeddings().weight is get_input_embeddings().weight``); None for heads
        that do not predict tokens."""
        return self.native.word_embedding() if self.native.head in TIED_HEADS else None

    def resize_token_embeddings(self, new_num_tokens: int | None = None,
                                pad_to_multiple_of: int | None = None,
                                mean_resizing: bool = True) -> nn.Embedding:
        """Grow or shrink the vocabulary to ``new_num_tokens`` (the word embedding, its tied
        heads and the config; `folnet.arch.vocab`): exactly that many rows, or rounded up to
        ``pad_to_multiple_of``, new rows as transformers initialises them (``mean_resizing``).
        ``config.vocab_size`` is the vocabulary; ids in the padding rows are refused."""
        if pad_to_multiple_of is not None:  # transformers' own check, and its message
            self._get_resized_embeddings(nn.Embedding(1, 1), 1, pad_to_multiple_of)
        if new_num_tokens is None:
            if pad_to_multiple_of is None:
                return self.get_input_embeddings()
            new_num_tokens = self.native.cfg.vocab_size
        embedding = self.native.resize_token_embeddings(new_num_tokens,
                                                        mean_resizing=mean_resizing,
                                                        pad_to_multiple_of=pad_to_multiple_of)
        self.config.model = self.native.cfg.to_dict()
        self.vocab_size = self.native.cfg.vocab_size  # as transformers' resize leaves it
        return embedding

    def _asked(self, output_attentions: bool | None, output_hidden_states: bool | None,
               output_relations: bool | None) -> dict[str, Any]:
        """What a call asks the native model to return; None: the config's setting."""
        def pick(value: bool | None, name: str) -> bool:
            return bool(getattr(self.config, name, False) if value is None else value)

        return {"output_attentions": pick(output_attentions, "output_attentions"),
                "output_hidden_states": pick(output_hidden_states, "output_hidden_states"),
                "output_relations": output_relations}

    def _labelled(self, output_cls: type, input_ids, attention_mask, token_type_ids, labels,
                  output_attentions, output_hidden_states, return_dict, inputs_embeds=None):
        """A head with one logits tensor and ``labels`` (classification, multiple choice), its
        outputs in ``output_cls``."""
        out = self._encoder_forward(input_ids, attention_mask, token_type_ids, inputs_embeds,
                                    labels=labels,
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

    def _encoder_forward(self, input_ids, attention_mask, token_type_ids, inputs_embeds=None,
                         *, output_attentions=None, output_hidden_states=None,
                         output_relations=None, **labels):
        ids = ids_for(input_ids, inputs_embeds)
        with embeddings_given(self.get_input_embeddings(), [inputs_embeds]):
            return self.native(ids, token_type_ids=token_type_ids,
                               attention_mask=attention_mask, **labels,
                               **self._asked(output_attentions, output_hidden_states,
                                             output_relations))


def _native_names_read(module: FolnetPreTrainedModel, state: dict[str, Any], prefix: str,
                       *args: Any) -> None:
    """``load_state_dict`` of a native model's state dict: its keys renamed in place to the
    class's own (`FolnetPreTrainedModel.own_name`) where only the renamed one is expected."""
    own = {prefix + k for k in module.state_dict(keep_vars=True)}
    for key in [k for k in state if k.startswith(prefix) and k not in own]:
        renamed = prefix + module.own_name(key[len(prefix):])
        if renamed in own and renamed not in state:
            state[renamed] = state.pop(key)


def states(out: Any) -> dict[str, Any]:
    """The per-layer fields of a native output, as transformers' outputs name them (and
    folnet's ``operator_attentions``: `folnet.hf.outputs`)."""
    return {"hidden_states": out.hidden_states, **attention_fields(out.attentions)}


def as_returned(output: ModelOutput, return_dict: bool | None) -> ModelOutput | tuple:
    """The output as transformers callers asked for it: the ModelOutput, or with
    ``return_dict=False`` its tuple of non-None fields."""
    return output if return_dict is not False else output.to_tuple()
