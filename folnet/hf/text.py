"""transformers classes for the text-to-text kinds: a causal LM and an encoder-decoder, both
generating through transformers' `GenerationMixin` (greedy, sampling, beam search, logits
processors, stopping criteria, streamers, ``generation_config``, ``return_dict_in_generate``).

The past state transformers carries between steps is `FolnetCache`: folnet's own incremental
cache (`folnet.arch.models.text.Session`), so each new token still costs one row per layer.
``generate`` asks for it with ``use_cache=True``: the first forward call starts a session over
the prompt (or, for the encoder-decoder, over the encoder outputs and the decoder start
tokens) and returns it as ``cache``; later calls step it with the new tokens; beam search
reorders it. A forward call without ``use_cache`` (training, evaluation) is the native forward.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from transformers import GenerationMixin
from transformers.modeling_outputs import CausalLMOutputWithPast, Seq2SeqLMOutput
from transformers.utils import ModelOutput

from folnet.arch.inputs import check_ids, check_mask, check_prefix
from folnet.arch.layer.atoms import token_positions
from folnet.arch.layer.stack import Record
from folnet.arch.models.text import Session
from folnet.errors import FolnetError
from folnet.hf.modeling import FolnetPreTrainedModel, as_returned


class FolnetCache:
    """A folnet generation session as transformers' ``cache``: ``get_seq_length`` (decoder
    tokens consumed), ``reorder_cache`` (beam search). It is not a `transformers.Cache`: its
    buffers are folnet's context channels, not keys and values."""

    is_compileable = False
    is_croppable = False

    def __init__(self, session: Session, offset: int = 0):
        self.session = session
        self.offset = offset  # domain positions before the decoder's tokens (enc-dec inputs)
        self.is_linear = [False]

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.session.length - self.offset

    def reorder_cache(self, beam_idx: torch.Tensor) -> None:
        self.session.reorder(beam_idx)

    def new_tokens(self, ids: torch.Tensor) -> torch.Tensor:
        """The part of ``ids`` not consumed yet: generate passes the last token, a caller that
        continues a cached generation may pass the whole sequence."""
        seen = self.get_seq_length()
        return ids[:, seen:] if ids.shape[1] > seen else ids


#: The name transformers gives the past state, in the outputs and in forward's arguments:
#: ``cache`` from 5.24 on, ``past_key_values`` before (5.0-5.23; the GPU images carry 5.17).
CACHE = "cache" if "cache" in CausalLMOutputWithPast.__dataclass_fields__ else "past_key_values"


def _past(cache: FolnetCache | None, kwargs: dict[str, Any]) -> FolnetCache | None:
    """The cache a call passed, by either name (an older transformers' generate passes
    ``past_key_values``)."""
    older = kwargs.pop("past_key_values", None)
    return cache if cache is not None else older


def _kept(logits: torch.Tensor, logits_to_keep: int) -> torch.Tensor:
    """The last ``logits_to_keep`` positions' logits (all of them for 0)."""
    return logits[:, -logits_to_keep:] if logits_to_keep else logits


class _Generating(FolnetPreTrainedModel, GenerationMixin):
    """What both text classes share with transformers' generation."""

    @classmethod
    def _supports_default_dynamic_cache(cls) -> bool:
        return False  # the cache is folnet's own, made by the first forward call

    def _record(self, output_attentions, output_hidden_states) -> Record | None:
        asked = self._asked(output_attentions, output_hidden_states, None)
        return Record.asked(asked["output_hidden_states"], False, asked["output_attentions"])

    @staticmethod
    def _states(record: Record | None) -> dict[str, Any]:
        if record is None:
            return {}
        return {"hidden_states": None if record.hidden is None else tuple(record.hidden),
                "attentions": None if record.attentions is None else tuple(record.attentions)}


class FolnetForCausalLM(_Generating):
    """Decoder-only FOLNet (``AutoModelForCausalLM``); ``labels`` are the inputs (shifted
    inside), ``prefix_lengths`` makes a PrefixLM. A decoder has no token types: tokenizers'
    all-zero ``token_type_ids`` are accepted and ignored."""

    kind = "decoder"
    head = "lm"

    def forward(self, input_ids=None, attention_mask=None, token_type_ids=None, labels=None,
                prefix_lengths=None, cache: FolnetCache | None = None,
                use_cache: bool | None = None, logits_to_keep: int = 0,
                output_attentions: bool | None = None, output_hidden_states: bool | None = None,
                output_relations: bool | None = None, return_dict: bool | None = None,
                **kwargs: Any):
        if token_type_ids is not None and bool(torch.as_tensor(token_type_ids).any()):
            raise FolnetError("token_type_ids: a FOLNet decoder has no token types; give none "
                              "(or zeros)")
        native = self.native
        cache = _past(cache, kwargs)
        if cache is not None or (use_cache and labels is None and not output_relations):
            record = self._record(output_attentions, output_hidden_states)
            if cache is not None:  # one more step of a running generation
                logits = cache.session.step(check_ids(native.cfg, cache.new_tokens(input_ids)),
                                            record)
            else:  # generate's first call: the prompt
                ids = check_ids(native.cfg, input_ids)
                pad = check_mask(attention_mask, ids)
                prefix = check_prefix(prefix_lengths, *ids.shape, ids.device)
                logits, session = native.begin(ids, pad, prefix, record=record)
                cache = FolnetCache(session)
            return as_returned(CausalLMOutputWithPast(
                logits=_kept(logits, logits_to_keep), **{CACHE: cache}, **self._states(record)),
                return_dict)
        out = native(input_ids, prefix_lengths=prefix_lengths, labels=labels,
                     attention_mask=attention_mask,
                     **self._asked(output_attentions, output_hidden_states, output_relations))
        return as_returned(CausalLMOutputWithPast(
            loss=out.loss, logits=_kept(out.logits, logits_to_keep),
            hidden_states=out.hidden_states, attentions=out.attentions), return_dict)


@dataclass
class FolnetEncoderOutput(ModelOutput):
    """The encoder-decoder's encoder outputs as generate hands them to each decoder call: the
    final unary atoms and the final binary atoms (the decoder's cross context reads both)."""

    last_hidden_state: torch.Tensor | None = None  # (B, N, D1)
    relation_output: torch.Tensor | None = None  # (B, N, N, D2)
    hidden_states: tuple[torch.Tensor, ...] | None = None
    attentions: tuple[dict[str, torch.Tensor], ...] | None = None


class _Encoder(nn.Module):
    """``get_encoder()`` of `FolnetForConditionalGeneration`: the native model's encoder stack
    as transformers calls it (its modules stay the native model's: no state-dict keys here)."""

    def __init__(self, owner: FolnetForConditionalGeneration):
        super().__init__()
        object.__setattr__(self, "owner", owner)

    def forward(self, input_ids=None, attention_mask=None, output_attentions=None,
                output_hidden_states=None, return_dict: bool | None = True, **kwargs: Any):
        native = self.owner.native
        ids = check_ids(native.cfg, input_ids)
        record = self.owner._record(output_attentions, output_hidden_states)
        if record is not None and record.hidden is not None:
            record.relations = []
        e1, e2, _ = native.encode(ids, check_mask(attention_mask, ids), record)
        out = FolnetEncoderOutput(e1, e2, **self.owner._states(record))
        return as_returned(out, return_dict)


class FolnetForConditionalGeneration(_Generating):
    """Encoder-decoder FOLNet (``AutoModelForSeq2SeqLM``); ``labels`` are the targets, the
    decoder inputs are them shifted right when not given. ``generate`` starts the decoder from
    ``decoder_start_token_id`` (config; 0 as the native model's)."""

    kind = "encoder-decoder"
    head = "lm"

    def __init__(self, config):
        super().__init__(config)
        object.__setattr__(self, "_encoder", _Encoder(self))
        self._start_token()

    def _start_token(self) -> None:
        """transformers 5 does not carry the config's decoder_start_token_id over to the
        generation config; generate needs it there."""
        if self.generation_config.decoder_start_token_id is None:
            self.generation_config.decoder_start_token_id = self.config.decoder_start_token_id

    @classmethod
    def from_pretrained(cls, *args: Any, **kwargs: Any):
        loaded = super().from_pretrained(*args, **kwargs)
        (loaded[0] if isinstance(loaded, tuple) else loaded)._start_token()
        return loaded

    def get_encoder(self, modality: str | None = None) -> nn.Module:
        return self._encoder

    def forward(self, input_ids=None, attention_mask=None, decoder_input_ids=None,
                decoder_attention_mask=None, labels=None,
                encoder_outputs: FolnetEncoderOutput | tuple | None = None,
                cache: FolnetCache | None = None, use_cache: bool | None = None,
                logits_to_keep: int = 0, output_attentions: bool | None = None,
                output_hidden_states: bool | None = None, output_relations: bool | None = None,
                return_dict: bool | None = None, **kwargs: Any):
        native = self.native
        cache = _past(cache, kwargs)
        if cache is not None or (use_cache and labels is None and decoder_input_ids is not None
                                 and decoder_attention_mask is None and not output_relations):
            record = self._record(output_attentions, output_hidden_states)
            if cache is not None:
                new = check_ids(native.cfg, cache.new_tokens(decoder_input_ids),
                                "decoder_input_ids")
                logits = cache.session.step(new, record)
            else:  # generate's first decoder call
                start = check_ids(native.cfg, decoder_input_ids, "decoder_input_ids")
                encoded, pad = self._encoded(input_ids, attention_mask, encoder_outputs)
                logits, session = native.begin(None, pad, start, encoded=encoded, record=record)
                cache = FolnetCache(session, offset=encoded[0].shape[1])
            return as_returned(Seq2SeqLMOutput(
                logits=_kept(logits, logits_to_keep), **{CACHE: cache},
                decoder_hidden_states=self._states(record).get("hidden_states"),
                decoder_attentions=self._states(record).get("attentions")), return_dict)
        asked = self._asked(output_attentions, output_hidden_states, output_relations)
        if encoder_outputs is not None and labels is None:  # generate without a cache
            encoded, _ = self._encoded(input_ids, attention_mask, encoder_outputs)
            out = native.decode(encoded, decoder_input_ids, attention_mask=attention_mask,
                                decoder_attention_mask=decoder_attention_mask, **asked)
        else:
            out = native(input_ids, decoder_input_ids=decoder_input_ids, labels=labels,
                         attention_mask=attention_mask,
                         decoder_attention_mask=decoder_attention_mask, **asked)
        return as_returned(Seq2SeqLMOutput(
            loss=out.loss, logits=_kept(out.logits, logits_to_keep),
            decoder_hidden_states=out.hidden_states, decoder_attentions=out.attentions,
            encoder_last_hidden_state=out.encoder_sequence_output,
            encoder_hidden_states=out.encoder_hidden_states,
            encoder_attentions=out.encoder_attentions), return_dict)

    def _encoded(self, input_ids, attention_mask, encoder_outputs):
        """The encoder's final atoms and positions, and the inputs' padding, from generate's
        ``encoder_outputs`` (or by running the encoder)."""
        if encoder_outputs is None:
            encoder_outputs = self._encoder(input_ids, attention_mask)
        if isinstance(encoder_outputs, tuple):
            encoder_outputs = FolnetEncoderOutput(*encoder_outputs)
        e1, e2 = encoder_outputs.last_hidden_state, encoder_outputs.relation_output
        if e2 is None:
            raise FolnetError("encoder_outputs must carry relation_output (the encoder's final "
                              "binary atoms): make them with model.get_encoder()")
        pad = None if attention_mask is None else check_mask(
            attention_mask, torch.empty(e1.shape[:2], dtype=torch.long, device=e1.device))
        return (e1, e2, token_positions(pad, e1.shape[1], e1.device)), pad
