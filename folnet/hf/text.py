"""transformers classes for the text-to-text kinds: a causal LM and an encoder-decoder, both
generating through transformers' `GenerationMixin` (greedy, sampling, beam search, logits
processors, stopping criteria, streamers, ``generation_config``, ``return_dict_in_generate``).

The past state transformers carries between steps is `FolnetCache`: folnet's own incremental
cache (`folnet.arch.models.text.Session`), so each new token still costs one row per layer.
``generate`` makes it empty; the first forward call starts a session over the prompt (or, for
the encoder-decoder, over the encoder outputs and the decoder start tokens) and returns it as
``cache``; later calls step it with the new tokens (several at once when assisted decoding or
prompt lookup verifies candidates, which then crops the rejected ones); beam search reorders
it. A forward call without ``use_cache`` or a cache (training, evaluation) is the native
forward. Input values are checked in eager mode only, so that ``torch.compile`` captures a
cached step as one graph (tests/hf/test_hf_compile.py).
"""

from __future__ import annotations

import operator
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from transformers import GenerationMixin
from transformers.modeling_outputs import CausalLMOutputWithPast
from transformers.utils import ModelOutput

from folnet.arch.heads import mlm_loss
from folnet.arch.inputs import check_ids, check_mask, check_prefix, values_checked
from folnet.arch.layer.atoms import token_positions
from folnet.arch.layer.stack import Record
from folnet.arch.models.text import Session
from folnet.errors import FolnetError
from folnet.hf.config import FolnetConfig
from folnet.hf.embeds import embeddings_given, ids_for
from folnet.hf.outputs import FolnetCausalLMOutputWithPast, FolnetSeq2SeqLMOutput, attention_fields
from folnet.hf.pretrained import FolnetPreTrainedModel, states
from folnet.hf.text_base import FolnetDecoderModel, FolnetEncoderDecoderModel


class FolnetCache:
    """A folnet generation session as transformers' ``cache``: ``get_seq_length`` (decoder
    tokens consumed), ``reorder_cache`` (beam search), ``crop`` (assisted decoding and prompt
    lookup). It is not a `transformers.Cache`: its buffers are folnet's context channels, not
    keys and values. generate makes it empty (assisted decoding asks for the cache before the
    first forward call) and the first forward call starts its session."""

    # True would have transformers compile every generate's steps on a GPU (its static-cache
    # path); torch.compile of the step is the user's choice (tests/hf/test_hf_compile.py)
    is_compileable = False
    is_croppable = True

    def __init__(self, session: Session | None = None, offset: int = 0):
        self.session = session  # None until the first forward call starts it
        self.offset = offset  # domain positions before the decoder's tokens (enc-dec inputs)
        self.is_linear = [False]

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return 0 if self.session is None else self.session.length - self.offset

    def reorder_cache(self, beam_idx: torch.Tensor) -> None:
        self.session.reorder(beam_idx)

    def activate_past_recording(self, **kwargs: object) -> None:
        """Nothing to do: a crop only moves the session's length back (`Session.crop`). The
        keywords are transformers' (``recurrent_states_to_keep`` from 5.25 on, for caches of
        recurrent states); folnet keeps every position's channels, so none applies."""

    def get_recurrent_states_to_keep(self, layer_idx: int | None = None) -> int:
        """0: no recurrent states (transformers 5.25 asks before a streamed generate)."""
        return 0

    def crop(self, max_length: int) -> None:
        """Drop decoder tokens: ``crop(-k)`` the last k (what assisted decoding asks after the
        model rejected k candidates; ``crop(0)`` drops none), ``crop(n)`` all but the first n
        (transformers' older form). A PrefixLM's prompt is never dropped (`Session.crop`):
        transformers reads ``get_seq_length`` after a crop and feeds every token not kept."""
        try:  # an int, or the 0-d tensor transformers 5.17 computes it as
            given = None if isinstance(max_length, bool) else operator.index(max_length)
        except TypeError:
            given = None
        if given is None:
            raise FolnetError(f"crop takes an integer number of tokens, got {max_length!r}")
        max_length = given
        seen = self.get_seq_length()
        keep = seen + max_length if max_length <= 0 else min(max_length, seen)
        if keep < 0:
            raise FolnetError(f"crop({max_length}): the cache holds only {seen} tokens")
        if self.session is not None:
            self.session.crop(max(self.offset + keep, self.session.floor))


#: The name transformers gives the past state, in the outputs and in forward's arguments:
#: ``cache`` from 5.24 on, ``past_key_values`` before (5.0-5.23; the GPU images carry 5.17).
CACHE = "cache" if "cache" in CausalLMOutputWithPast.__dataclass_fields__ else "past_key_values"


def _past(cache: FolnetCache | None, older: FolnetCache | None) -> FolnetCache | None:
    """The cache a call passed, by either name: forward declares both, since transformers
    5.17 refuses a generate argument (its ``past_key_values``) that forward does not name."""
    return cache if cache is not None else older


def _values(native: nn.Module, ids: object) -> bool:
    """Whether this call checks input values (`folnet.arch.inputs.values_checked`): on the
    CPU, never while torch.compile traces (a value read would break the graph)."""
    return isinstance(ids, torch.Tensor) and values_checked(ids, native.validate)


def _kept(logits: torch.Tensor, logits_to_keep: int) -> torch.Tensor:
    """The last ``logits_to_keep`` positions' logits (all of them for 0)."""
    return logits[:, -logits_to_keep:] if logits_to_keep else logits


class _Generating(FolnetPreTrainedModel, GenerationMixin):
    """What both text classes share with transformers' generation, and their layout: the base
    model (`folnet.hf.text_base`) under ``model``, the LM head beside it; model.safetensors
    holds the native names (without ``model.``)."""

    base_model_prefix = "model"
    base_class: type[FolnetDecoderModel | FolnetEncoderDecoderModel]

    def _children(self, config: FolnetConfig, native: nn.Module
                  ) -> Iterator[tuple[str, nn.Module]]:
        yield self.base_model_prefix, self.base_class.over(config, native)
        yield "lm", native.lm

    def _weights_as_saved(self) -> dict[str, torch.Tensor]:
        cut = len(self.base_model_prefix) + 1
        return {k[cut:] if k.startswith(f"{self.base_model_prefix}.") else k: v
                for k, v in self.state_dict().items()}

    def own_name(self, saved: str) -> str:
        return saved if saved.startswith("lm.") else f"{self.base_model_prefix}.{saved}"

    @classmethod
    def _supports_default_dynamic_cache(cls) -> bool:
        return False  # the cache is folnet's own (`_prepare_cache_for_generation`)

    def _prepare_cache_for_generation(self, generation_config, model_kwargs: dict[str, Any],
                                      *args: Any, **kwargs: Any) -> None:
        """An empty `FolnetCache` where transformers would make its own: assisted decoding
        and prompt lookup need the cache before the first forward call, which starts it."""
        super()._prepare_cache_for_generation(generation_config, model_kwargs, *args, **kwargs)
        if model_kwargs.get(CACHE) is None and generation_config.use_cache is not False:
            model_kwargs[CACHE] = FolnetCache()

    def _record(self, output_attentions, output_hidden_states) -> Record | None:
        asked = self._asked(output_attentions, output_hidden_states, None)
        return Record.asked(asked["output_hidden_states"], False, asked["output_attentions"])

    @staticmethod
    def _states(record: Record | None, prefix: str = "") -> dict[str, Any]:
        """A cached step's recorded states, as the outputs name them (`folnet.hf.outputs`)."""
        if record is None:
            return {}
        return {f"{prefix}hidden_states": None if record.hidden is None else tuple(record.hidden),
                **attention_fields(record.attentions, prefix)}


class FolnetForCausalLM(_Generating):
    """Decoder-only FOLNet (``AutoModelForCausalLM``); ``labels`` are the inputs (shifted
    inside), or ``shift_labels`` the targets already shifted (as transformers' sequence
    parallelism gives them: position t's label is the token after t, -100 ignored);
    ``prefix_lengths`` makes a PrefixLM. A decoder has no token types: tokenizers'
    all-zero ``token_type_ids`` are accepted and ignored."""

    kind = "decoder"
    head = "lm"
    base_class = FolnetDecoderModel

    def forward(self, input_ids=None, attention_mask=None, token_type_ids=None, labels=None,
                prefix_lengths=None, cache: FolnetCache | None = None,
                past_key_values: FolnetCache | None = None,
                use_cache: bool | None = None, logits_to_keep: int = 0,
                output_attentions: bool | None = None, output_hidden_states: bool | None = None,
                output_relations: bool | None = None, return_dict: bool | None = None,
                inputs_embeds: torch.Tensor | None = None, **kwargs: Any):
        input_ids = ids_for(input_ids, inputs_embeds)
        with embeddings_given(self.get_input_embeddings(), [inputs_embeds]):
            native = self.native
            values = _values(native, input_ids)
            if (token_type_ids is not None and values
                    and bool(torch.as_tensor(token_type_ids).any())):
                raise FolnetError("token_type_ids: a FOLNet decoder has no token types; give none "
                                  "(or zeros)")
            cache = _past(cache, past_key_values)
            if cache is not None or (use_cache and labels is None and not output_relations):
                record = self._record(output_attentions, output_hidden_states)
                ids = check_ids(native.cfg, input_ids, values=values)  # (B, k): the new tokens
                if cache is not None and cache.session is not None:  # a running generation
                    logits = cache.session.step(ids, record)
                else:  # generate's first call: the prompt
                    pad = check_mask(attention_mask, ids, values=values)
                    prefix = check_prefix(prefix_lengths, *ids.shape, ids.device, values=values)
                    logits, session = native.begin(ids, pad, prefix, record=record)
                    cache = cache if cache is not None else FolnetCache()
                    cache.session = session
                return self._returned(FolnetCausalLMOutputWithPast(
                    logits=_kept(logits, logits_to_keep), **{CACHE: cache}, **self._states(record)),
                    return_dict)
            shift_labels = kwargs.get("shift_labels")  # targets already aligned with the logits
            out = native(input_ids, prefix_lengths=prefix_lengths,
                         labels=labels if shift_labels is None else None,
                         attention_mask=attention_mask,
                         **self._asked(output_attentions, output_hidden_states, output_relations))
            loss = out.loss
            if shift_labels is not None:  # sequence parallelism: the shift was made across ranks
                loss = mlm_loss(out.logits, torch.as_tensor(shift_labels, device=out.logits.device))
            return self._returned(FolnetCausalLMOutputWithPast(
                loss=loss, logits=_kept(out.logits, logits_to_keep), **states(out)),
                return_dict)


@dataclass
class FolnetEncoderOutput(ModelOutput):
    """The encoder-decoder's encoder outputs as generate hands them to each decoder call: the
    final unary atoms and the final binary atoms (the decoder's cross context reads both)."""

    last_hidden_state: torch.Tensor | None = None  # (B, N, D1)
    relation_output: torch.Tensor | None = None  # (B, N, N, D2)
    hidden_states: tuple[torch.Tensor, ...] | None = None
    attentions: tuple[torch.Tensor, ...] | None = None  # L of (B, H, N, N)
    operator_attentions: tuple[dict[str, torch.Tensor], ...] | None = None


class _Encoder(nn.Module):
    """``get_encoder()`` of `FolnetForConditionalGeneration`: the native model's encoder stack
    as transformers calls it (its modules stay the native model's: no state-dict keys here)."""

    def __init__(self, owner: FolnetForConditionalGeneration):
        super().__init__()
        object.__setattr__(self, "owner", owner)

    def forward(self, input_ids=None, attention_mask=None, output_attentions=None,
                output_hidden_states=None, return_dict: bool | None = True,
                inputs_embeds: torch.Tensor | None = None, **kwargs: Any):
        native = self.owner.native
        input_ids = ids_for(input_ids, inputs_embeds)
        values = _values(native, input_ids)
        ids = check_ids(native.cfg, input_ids, values=values)
        record = self.owner._record(output_attentions, output_hidden_states)
        if record is not None and record.hidden is not None:
            record.relations = []
        with embeddings_given(self.owner.get_input_embeddings(), [inputs_embeds]):
            e1, e2, _ = native.encode(ids, check_mask(attention_mask, ids, values=values),
                                      record)
        out = FolnetEncoderOutput(e1, e2, **self.owner._states(record))
        return self.owner._returned(out, return_dict)


class FolnetForConditionalGeneration(_Generating):
    """Encoder-decoder FOLNet (``AutoModelForSeq2SeqLM``); ``labels`` are the targets, the
    decoder inputs are them shifted right when not given. ``generate`` starts the decoder from
    ``decoder_start_token_id`` (config; 0 as the native model's)."""

    kind = "encoder-decoder"
    head = "lm"
    base_class = FolnetEncoderDecoderModel

    def __init__(self, config):
        super().__init__(config)
        object.__setattr__(self, "_encoder", _Encoder(self))
        self._start_token()

    def activation_checkpointing_enable(self, activation_checkpointing_kwargs=None,
                                        *args: Any, **kwargs: Any) -> None:
        """transformers' checkpointing, but not re-entrant: each decoder layer reads the
        encoder's outputs through its cross context, not through its arguments, and
        ``use_reentrant=True`` would run the backward into the encoder once per layer."""
        if (activation_checkpointing_kwargs or {}).get("use_reentrant"):
            raise FolnetError("use_reentrant=True: an encoder-decoder FOLNet's decoder layers "
                              "read the encoder's outputs outside their arguments, which "
                              "re-entrant checkpointing cannot follow; use use_reentrant=False "
                              "(transformers' default)")
        super().activation_checkpointing_enable(activation_checkpointing_kwargs, *args,
                                                **kwargs)

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
                cache: FolnetCache | None = None, past_key_values: FolnetCache | None = None,
                use_cache: bool | None = None,
                logits_to_keep: int = 0, output_attentions: bool | None = None,
                output_hidden_states: bool | None = None, output_relations: bool | None = None,
                return_dict: bool | None = None, inputs_embeds: torch.Tensor | None = None,
                decoder_inputs_embeds: torch.Tensor | None = None, **kwargs: Any):
        if encoder_outputs is None:
            input_ids = ids_for(input_ids, inputs_embeds)
        decoder_input_ids = ids_for(decoder_input_ids, decoder_inputs_embeds,
                                    "decoder_input_ids and decoder_inputs_embeds")
        given = ([decoder_inputs_embeds] if encoder_outputs is not None  # no encoder lookup
                 else [inputs_embeds, decoder_inputs_embeds])
        with embeddings_given(self.get_input_embeddings(), given):
            native = self.native
            cache = _past(cache, past_key_values)
            if cache is not None or (use_cache and labels is None and decoder_input_ids is not None
                                     and decoder_attention_mask is None and not output_relations):
                record = self._record(output_attentions, output_hidden_states)
                ids = check_ids(native.cfg, decoder_input_ids, "decoder_input_ids",
                                values=_values(native, decoder_input_ids))  # (B, k) new tokens
                if cache is not None and cache.session is not None:
                    logits = cache.session.step(ids, record)
                else:  # generate's first decoder call: the start token (and any candidates)
                    encoded, pad = self._encoded(input_ids, attention_mask, encoder_outputs)
                    logits, session = native.begin(None, pad, ids, encoded=encoded, record=record)
                    cache = cache if cache is not None else FolnetCache()
                    cache.session, cache.offset = session, encoded[0].shape[1]
                return self._returned(FolnetSeq2SeqLMOutput(
                    logits=_kept(logits, logits_to_keep), **{CACHE: cache},
                    **self._states(record, "decoder_")), return_dict)
            asked = self._asked(output_attentions, output_hidden_states, output_relations)
            if encoder_outputs is not None and labels is None:  # generate without a cache
                encoded, _ = self._encoded(input_ids, attention_mask, encoder_outputs)
                out = native.decode(encoded, decoder_input_ids, attention_mask=attention_mask,
                                    decoder_attention_mask=decoder_attention_mask, **asked)
            else:
                out = native(input_ids, decoder_input_ids=decoder_input_ids, labels=labels,
                             attention_mask=attention_mask,
                             decoder_attention_mask=decoder_attention_mask, **asked)
            return self._returned(FolnetSeq2SeqLMOutput(
                loss=out.loss, logits=_kept(out.logits, logits_to_keep),
                decoder_hidden_states=out.hidden_states,
                encoder_last_hidden_state=out.encoder_sequence_output,
                encoder_hidden_states=out.encoder_hidden_states,
                **attention_fields(out.attentions, "decoder_"),
                **attention_fields(out.encoder_attentions, "encoder_")), return_dict)

    def prepare_inputs_for_generation(self, decoder_input_ids: torch.Tensor, *args: Any,
                                      **kwargs: Any) -> dict[str, Any]:
        """transformers' inputs, with the decoder tokens the cache has not consumed: generate
        passes the decoder tokens so far, and transformers 5.17 does not cut them for an
        assistant's later calls (its decoder has no attention mask to measure them by)."""
        inputs = super().prepare_inputs_for_generation(decoder_input_ids, *args, **kwargs)
        cache = inputs.get(CACHE)
        if isinstance(cache, FolnetCache) and cache.session is not None:
            seen = cache.get_seq_length()
            inputs["decoder_input_ids"] = decoder_input_ids[:, seen:].contiguous()
        return inputs

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
            attention_mask, torch.empty(e1.shape[:2], dtype=torch.long, device=e1.device),
            values=_values(self.native, attention_mask))
        return (e1, e2, token_positions(pad, e1.shape[1], e1.device)), pad
