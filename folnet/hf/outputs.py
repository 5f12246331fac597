"""The outputs of folnet's transformers classes: transformers' own, each with folnet's
``operator_attentions`` beside the ``attentions`` transformers tools read.

transformers (bertviz, captum, every attention-probing script) reads ``attentions`` as one
(B, H, T, T) tensor per layer. A FOLNet layer runs several softmax operators, of other shapes
too (``c``'s kernel is (B, S, H, T)): ``attentions[l]`` is layer l's first attention-shaped
operator -- a softmax over key tokens per head and query token whose output is the unary
stream (``j``, then ``m``: `attention_shaped`) -- and ``operator_attentions[l]`` holds every
softmax operator's activated kernel by symbol (`folnet.arch.layer.stack.Record`). Both are the
tensors the output was computed from, so ``retain_grad`` on them sees gradients.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import torch
from transformers.modeling_outputs import (
    CausalLMOutputWithPast,
    MaskedLMOutput,
    MultipleChoiceModelOutput,
    QuestionAnsweringModelOutput,
    Seq2SeqLMOutput,
    SequenceClassifierOutput,
    TokenClassifierOutput,
)
from transformers.utils import ModelOutput

from folnet.ops.registry import get_operator

Kernels = tuple[dict[str, torch.Tensor], ...]


@functools.lru_cache(maxsize=256)
def attention_shaped(symbol: str) -> bool:
    """Whether operator ``symbol``'s activated kernel is an attention map (B, H, Tq, Tk): a
    softmax over key tokens (``a``) per head (``h``) and query token (``x``), written to the
    unary stream (``j``, ``m``; not ``c``, whose kernel is per channel, nor ``t``, which
    writes the binary stream)."""
    spec = get_operator(symbol)
    return (spec.activation == "softmax" and spec.typing.output == "U"
            and sorted(spec.kernel) == ["a", "h", "x"] and spec.rdim == "a")


def attention_fields(layers: list[dict[str, torch.Tensor]] | tuple | None,
                     prefix: str = "") -> dict[str, Any]:
    """``attentions`` and ``operator_attentions`` (under ``prefix``) of the per-layer
    kernels a forward pass recorded; ``attentions`` is None when some layer runs no
    attention-shaped operator (its kernels are still in ``operator_attentions``)."""
    if layers is None:
        return {f"{prefix}attentions": None, f"{prefix}operator_attentions": None}
    picked = [next((k for s, k in kernels.items() if attention_shaped(s)), None)
              for kernels in layers]
    attentions = None if any(p is None for p in picked) else tuple(picked)
    return {f"{prefix}attentions": attentions, f"{prefix}operator_attentions": tuple(layers)}


@dataclass
class FolnetModelOutput(ModelOutput):
    """The bare encoder's outputs: final unary atoms, pooled token 0, final binary atoms (with
    ``output_relations=True``), and on request the per-layer states and attentions."""

    last_hidden_state: torch.Tensor | None = None  # (B, T, D1)
    pooler_output: torch.Tensor | None = None  # (B, D1)
    relation_output: torch.Tensor | None = None  # (B, T, T, D2)
    hidden_states: tuple[torch.Tensor, ...] | None = None  # L + 1 of (B, T, D1)
    attentions: tuple[torch.Tensor, ...] | None = None  # L of (B, H, T, T)
    relation_states: tuple[torch.Tensor, ...] | None = None  # L + 1 of (B, T, T, D2)
    operator_attentions: Kernels | None = None  # L of {symbol: kernel}


@dataclass
class FolnetForPreTrainingOutput(ModelOutput):
    loss: torch.Tensor | None = None
    prediction_logits: torch.Tensor | None = None  # (B, T, V)
    seq_relationship_logits: torch.Tensor | None = None  # (B, 2)
    hidden_states: tuple[torch.Tensor, ...] | None = None
    attentions: tuple[torch.Tensor, ...] | None = None
    operator_attentions: Kernels | None = None


@dataclass
class FolnetMaskedLMOutput(MaskedLMOutput):
    operator_attentions: Kernels | None = None


@dataclass
class FolnetSequenceClassifierOutput(SequenceClassifierOutput):
    operator_attentions: Kernels | None = None


@dataclass
class FolnetMultipleChoiceModelOutput(MultipleChoiceModelOutput):
    operator_attentions: Kernels | None = None


@dataclass
class FolnetQuestionAnsweringModelOutput(QuestionAnsweringModelOutput):
    operator_attentions: Kernels | None = None


@dataclass
class FolnetTokenClassifierOutput(TokenClassifierOutput):
    operator_attentions: Kernels | None = None


@dataclass
class FolnetCausalLMOutputWithPast(CausalLMOutputWithPast):
    operator_attentions: Kernels | None = None


@dataclass
class FolnetSeq2SeqLMOutput(Seq2SeqLMOutput):
    """The decoder attends over the encoder's tokens and its own in one softmax (one domain:
    `folnet.arch.models.encdec`), so ``decoder_attentions`` are (B, H, Td, Ne + Td) and there
    are no separate ``cross_attentions``."""

    decoder_operator_attentions: Kernels | None = None
    encoder_operator_attentions: Kernels | None = None
