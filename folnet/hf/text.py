"""transformers classes for the text-to-text kinds: a causal LM and an encoder-decoder.

Generation is folnet's own (`FolnetDecoderLM.generate`: greedy or sampled, with the
incremental row cache), not transformers' GenerationMixin."""

from __future__ import annotations

from typing import Any

from transformers.modeling_outputs import CausalLMOutput, Seq2SeqLMOutput

from folnet.hf.modeling import FolnetPreTrainedModel, as_returned


class FolnetForCausalLM(FolnetPreTrainedModel):
    """Decoder-only FOLNet (``AutoModelForCausalLM``); ``labels`` are the inputs (shifted
    inside), ``prefix_lengths`` makes a PrefixLM."""

    kind = "decoder"
    head = "lm"

    def forward(self, input_ids=None, attention_mask=None, labels=None, prefix_lengths=None,
                return_dict: bool | None = None, **kwargs: Any):
        out = self.native(input_ids, prefix_lengths=prefix_lengths, labels=labels,
                          attention_mask=attention_mask)
        return as_returned(CausalLMOutput(loss=out.loss, logits=out.logits), return_dict)

    def generate(self, input_ids, max_new_tokens: int = 20, **kwargs: Any):
        """`folnet.arch.models.decoder.FolnetDecoderLM.generate`."""
        return self.native.generate(input_ids, max_new_tokens, **kwargs)


class FolnetForConditionalGeneration(FolnetPreTrainedModel):
    """Encoder-decoder FOLNet (``AutoModelForSeq2SeqLM``); ``labels`` are the targets, the
    decoder inputs are them shifted right when not given."""

    kind = "encoder-decoder"
    head = "lm"

    def forward(self, input_ids=None, attention_mask=None, decoder_input_ids=None,
                decoder_attention_mask=None, labels=None, return_dict: bool | None = None,
                **kwargs: Any):
        out = self.native(input_ids, decoder_input_ids=decoder_input_ids, labels=labels,
                          attention_mask=attention_mask,
                          decoder_attention_mask=decoder_attention_mask)
        return as_returned(Seq2SeqLMOutput(loss=out.loss, logits=out.logits,
                                         encoder_last_hidden_state=out.encoder_sequence_output),
                         return_dict)

    def generate(self, input_ids, max_new_tokens: int = 20, **kwargs: Any):
        """`folnet.arch.models.encdec.FolnetEncoderDecoder.generate`."""
        return self.native.generate(input_ids, max_new_tokens, **kwargs)
