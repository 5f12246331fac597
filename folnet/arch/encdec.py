"""The encoder-decoder FOLNet (paper Appendix A.5); the layout is described in
`folnet.arch.text2text`."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from folnet.arch.config import ModelConfig
from folnet.arch.decoder import DecoderLayer
from folnet.arch.embeddings import BaseAtoms, relative_position_ids
from folnet.arch.heads import MLMHead
from folnet.arch.kvcache import GenerationCache
from folnet.arch.layer import FolnetLayer
from folnet.arch.objectives import seq2seq_loss, shift_right
from folnet.arch.t2t_common import (
    DecoderAtoms,
    TextModel,
    TextOutput,
    check_ids,
    check_labels,
    check_mask,
    domain_rel_ids,
    visibility,
)
from folnet.errors import FolnetError


class FolnetEncoderDecoder(TextModel):
    """Encoder-decoder FOLNet: bidirectional encoder, causal dual-branch decoder whose binary
    atoms include the input->output relations (module docstring for the layout)."""

    decoder_start_token_id: int = 0

    def __init__(self, cfg: ModelConfig, head: str | None = None):
        super().__init__()
        self._setup(cfg, "encoder-decoder", head)
        self.encoder_atoms = BaseAtoms(cfg)
        self.encoder_layers = nn.ModuleList(FolnetLayer(lp, cfg) for lp in self.plan.layers)
        self.decoder_atoms = DecoderAtoms(cfg, shared_word=self.encoder_atoms.word)
        self.decoder_layers = nn.ModuleList(DecoderLayer(lp, cfg, cross=True)
                                            for lp in self.plan.layers)
        self.lm = MLMHead(cfg, self.encoder_atoms.word)
        self.reset_parameters()

    def _decoder(self):
        return self.decoder_atoms, self.decoder_layers

    def encode(self, input_ids: torch.Tensor, pad: torch.Tensor | None = None
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """The encoder's final atoms: (B, N, D1), (B, N, N, D2)."""
        types = torch.zeros_like(input_ids)
        rel = (relative_position_ids(types, self.cfg.delta) if self.cfg.position == "rpe"
               else None)  # (B, N, N)
        u1, u2 = self.encoder_atoms(input_ids, types, rel)
        for layer in self.encoder_layers:
            u1, u2 = layer(u1, u2, pad, rel)
        return self._final(u1, u2)

    def _decode(self, enc, dec_ids, pad):
        """Decoder rows for dec_ids (B, M) after the N encoder rows, without a cache."""
        e1, e2 = enc
        N, M = e1.shape[1], dec_ids.shape[1]
        n = N + M
        visible = visibility(n, dec_ids.device, source=N)  # (1, n, n)
        rel = domain_rel_ids(self.cfg, n, dec_ids.device, source=N)
        rows = torch.arange(N, n, device=dec_ids.device)
        pos = torch.arange(M, device=dec_ids.device)
        u1, u2 = self.decoder_atoms(dec_ids, pos, None if rel is None else rel[:, N:],
                                    visible[:, N:])  # (B, M, D1), (B, M, n, D2)
        for layer in self.decoder_layers:
            cu, cb = layer.cross_context(e1, e2)  # (B, N, Wu), (B, N, N, Wb)

            def assemble(own_u, own_b, cu=cu, cb=cb):
                ctx_u = None if own_u is None else torch.cat([cu, own_u], 1)  # (B, n, Wu)
                ctx_b = None if own_b is None else torch.cat(
                    [F.pad(cb, (0, 0, 0, M)), own_b], 1)  # (B, n, n, Wb)
                return ctx_u, ctx_b

            u1, u2 = layer.forward_rows(u1, u2, assemble, rows, visible, pad)
        return self._final(u1, u2)

    @staticmethod
    def _domain_pad(enc_pad, dec_pad, B, M, ids):
        """The padding mask of the domain (B, N + M), or None when nothing is padded."""
        if enc_pad is None and dec_pad is None:
            return None
        ones = ids.new_ones(B, ids.shape[1] + M, dtype=torch.bool)
        parts = [enc_pad if enc_pad is not None else ones[:, : ids.shape[1]],
                 dec_pad if dec_pad is not None else ones[:, :M]]
        return torch.cat(parts, dim=1)

    def forward(self, input_ids: torch.Tensor, decoder_input_ids: torch.Tensor | None = None,
                labels: torch.Tensor | None = None, attention_mask: torch.Tensor | None = None,
                decoder_attention_mask: torch.Tensor | None = None) -> TextOutput:
        """input_ids (B, N), decoder_input_ids (B, M) -> logits (B, M, V) for the token after
        each decoder position. ``labels`` (B, M) are the targets themselves (-100 ignored);
        without decoder_input_ids they are shifted right behind ``decoder_start_token_id``."""
        ids = check_ids(self.cfg, input_ids)
        if decoder_input_ids is None:
            if labels is None:
                raise FolnetError("give decoder_input_ids, or labels to derive them from")
            check_labels(labels, tuple(labels.shape))
            decoder_input_ids = shift_right(labels, self.decoder_start_token_id)
        dec = check_ids(self.cfg, decoder_input_ids, "decoder_input_ids")
        if dec.shape[0] != ids.shape[0]:
            raise FolnetError(f"decoder_input_ids have {dec.shape[0]} rows but input_ids have "
                              f"{ids.shape[0]}")
        if labels is not None:
            check_labels(labels, tuple(dec.shape))
        enc_pad = check_mask(attention_mask, ids, "attention_mask")
        dec_pad = check_mask(decoder_attention_mask, dec, "decoder_attention_mask",
                             "decoder_input_ids")
        e1, e2 = self.encode(ids, enc_pad)
        u1, u2 = self._decode((e1, e2), dec, self._domain_pad(enc_pad, dec_pad, *dec.shape, ids))
        logits = self._logits(u1)  # (B, M, V)
        loss = None if labels is None else seq2seq_loss(logits, labels)
        return TextOutput(logits=logits, sequence_output=u1, relation_output=u2, loss=loss,
                          encoder_sequence_output=e1, encoder_relation_output=e2)

    @torch.no_grad()
    def generate(self, input_ids: torch.Tensor, max_new_tokens: int, do_sample: bool = False,
                 temperature: float = 1.0, top_k: int | None = None,
                 generator: torch.Generator | None = None, *,
                 attention_mask: torch.Tensor | None = None,
                 decoder_start_token_id: int | None = None, use_cache: bool = True,
                 eos_token_id: int | None = None, pad_token_id: int | None = None,
                 return_logits: bool = False):
        """Decode ``max_new_tokens`` tokens for every input row: (B, 1 + new) ids starting with
        the decoder start token, or a `GenerationOutput` when ``return_logits``. The encoder
        runs once; ``use_cache=False`` recomputes encoder and decoder at each step."""
        ids = check_ids(self.cfg, input_ids)
        B = ids.shape[0]
        start_id = (self.decoder_start_token_id if decoder_start_token_id is None
                    else decoder_start_token_id)
        self._generation_args(1, "decoder start token", max_new_tokens=max_new_tokens,
                              do_sample=do_sample, temperature=temperature, top_k=top_k,
                              eos_token_id=eos_token_id, pad_token_id=pad_token_id)
        if not isinstance(start_id, int) or not 0 <= start_id < self.cfg.vocab_size:
            raise FolnetError(f"decoder_start_token_id must be an id in [0, vocab_size = "
                              f"{self.cfg.vocab_size}), got {start_id!r}")
        enc_pad = check_mask(attention_mask, ids, "attention_mask")
        start = torch.full((B, 1), start_id, dtype=ids.dtype, device=ids.device)
        if use_cache:
            first, step = self._cached(ids, enc_pad, start, max_new_tokens)
        else:
            seq = [start]

            def logits_now():
                dec = torch.cat(seq, dim=1)
                enc = self.encode(ids, enc_pad)
                pad = self._domain_pad(enc_pad, None, B, dec.shape[1], ids)
                return self._logits(self._decode(enc, dec, pad)[0][:, -1])

            def step(tokens):
                seq.append(tokens[:, None])
                return logits_now()

            first = logits_now()
        return self._finish(start, first, step, max_new_tokens, return_logits,
                            do_sample=do_sample, temperature=temperature, top_k=top_k,
                            generator=generator, eos_token_id=eos_token_id,
                            pad_token_id=pad_token_id)

    def _cached(self, ids, enc_pad, start, max_new_tokens):
        B, N = ids.shape
        cap = N + 1 + max_new_tokens
        e1, e2 = self.encode(ids, enc_pad)
        cache = GenerationCache(
            self.decoder_layers, batch=B, capacity=cap, visible=visibility(cap, ids.device,
                                                                           source=N),
            rel_ids=domain_rel_ids(self.cfg, cap, ids.device, source=N),
            pad=self._domain_pad(enc_pad, None, B, cap - N, ids), dtype=e1.dtype,
            device=ids.device)
        for i, layer in enumerate(self.decoder_layers):
            cu, cb = layer.cross_context(e1, e2)
            cache.write(i, 0, cu, cb)
        first = self._logits(self._step_rows(cache, start, N, N)[:, -1])

        def step(tokens):
            return self._logits(self._step_rows(cache, tokens[:, None], cache.length, N)[:, -1])

        return first, step
