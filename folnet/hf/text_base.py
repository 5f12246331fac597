"""The base models of the text classes: `FolnetDecoderModel` (of `FolnetForCausalLM`) and
`FolnetEncoderDecoderModel` (of `FolnetForConditionalGeneration`), each what its class holds
under ``base_model_prefix`` (``model``, as transformers' decoders name it): every module of
the native model but the LM head, and a forward that stops before the head (no logits).

Why: transformers' loading bridges a base model and a head class by that prefix (a base
folder loads into the head class with the head reported missing), and PEFT, probing scripts
and ``model.base_model`` read the states there. The weights keep the native names on disk --
the head class writes them without the prefix, and transformers adds it back where it loads a
folder saved by folnet or by an earlier version (`folnet.hf.text`).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from folnet.hf.config import FolnetConfig
from folnet.hf.embeds import embeddings_given, ids_for
from folnet.hf.outputs import FolnetModelOutput, attention_fields
from folnet.hf.pretrained import FolnetPreTrainedModel

__all__ = ["FolnetDecoderModel", "FolnetEncoderDecoderModel"]


class _TextBase(FolnetPreTrainedModel):
    """A text model's modules but its LM head, over the head class's native model."""

    base_model_prefix = "model"

    @classmethod
    def over(cls, config: FolnetConfig, native: nn.Module) -> _TextBase:
        """The base model of a head class: its native model's modules but ``lm`` (shared)."""
        return cls(config, native=native)

    def _children(self, config: FolnetConfig, native: nn.Module
                  ) -> Iterator[tuple[str, nn.Module]]:
        return ((name, child) for name, child in native.named_children() if name != "lm")

    def get_output_embeddings(self) -> None:
        return None  # no head: the LM head is the head class's


class FolnetDecoderModel(_TextBase):
    """The decoder's final states (``last_hidden_state`` (B, T, D1)), no next-token logits;
    ``prefix_lengths`` as `FolnetForCausalLM`'s."""

    kind = "decoder"

    def forward(self, input_ids=None, attention_mask=None, prefix_lengths=None,
                output_attentions: bool | None = None, output_hidden_states: bool | None = None,
                output_relations: bool | None = None, return_dict: bool | None = None,
                inputs_embeds: torch.Tensor | None = None, **kwargs: Any):
        input_ids = ids_for(input_ids, inputs_embeds)
        with embeddings_given(self.get_input_embeddings(), [inputs_embeds]):
            out = self.native(input_ids, prefix_lengths=prefix_lengths,
                              attention_mask=attention_mask, lm_head=False,
                              **self._asked(output_attentions, output_hidden_states,
                                            output_relations))
        return self._returned(_base_output(out), return_dict)


class FolnetEncoderDecoderModel(_TextBase):
    """The decoder's final states over the encoded inputs (``last_hidden_state`` (B, M, D1)),
    no logits; without ``decoder_input_ids`` the ``labels``' shift is not made here: give
    them."""

    kind = "encoder-decoder"

    def forward(self, input_ids=None, attention_mask=None, decoder_input_ids=None,
                decoder_attention_mask=None, output_attentions: bool | None = None,
                output_hidden_states: bool | None = None, output_relations: bool | None = None,
                return_dict: bool | None = None, inputs_embeds: torch.Tensor | None = None,
                decoder_inputs_embeds: torch.Tensor | None = None, **kwargs: Any):
        input_ids = ids_for(input_ids, inputs_embeds)
        decoder_input_ids = ids_for(decoder_input_ids, decoder_inputs_embeds,
                                    "decoder_input_ids and decoder_inputs_embeds")
        with embeddings_given(self.get_input_embeddings(),
                              [inputs_embeds, decoder_inputs_embeds]):
            out = self.native(input_ids, decoder_input_ids=decoder_input_ids,
                              attention_mask=attention_mask,
                              decoder_attention_mask=decoder_attention_mask, lm_head=False,
                              **self._asked(output_attentions, output_hidden_states,
                                            output_relations))
        return self._returned(_base_output(out), return_dict)


def _base_output(out: Any) -> FolnetModelOutput:
    """A native text output without its logits, as a base model returns it (the decoder's)."""
    return FolnetModelOutput(
        last_hidden_state=out.sequence_output, relation_output=out.relation_output,
        relation_states=out.relation_states, hidden_states=out.hidden_states,
        **attention_fields(out.attentions))
