"""The encoder-decoder FOLNet (paper Appendix A.5).

The bidirectional encoder stack reads the N input tokens (exactly the encoder-only FOLNet,
without pooler); then a causal decoder stack computes the rows of the M target tokens in the
domain "inputs then targets" (n = N + M positions):

* decoder unary atoms u1 (B, M, D1); decoder binary atoms u2 (B, M, n, D2): the target->input
  relations (dense) and the target->target relations (lower-triangular). Visibility is the
  PrefixLM pattern with prefix N: targets see every input and the earlier targets.
* ``j`` and ``a`` read their premise over the domain: the encoder's final unary atoms through a
  per-layer Linear (``cross_u``) for the inputs, concatenated with the decoder's own premises
  (self- and cross-attention in one softmax); ``c`` concatenates the same way at its kernel.
* ``t``: u_h(x, y) = sum_a K_h(x, a) v_h(a, y) with K from the decoder's binary atoms over all
  a; v(a, y) for input rows a is the encoder's final binary atoms through a per-layer Linear
  (``cross_b``), zero for (input a, target y), so for target y only targets a contribute -- the
  formula of Appendix A.5, normalised over every visible a.
* ``m`` and ``p`` are unchanged (they read decoder binary rows, which include the inputs).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from folnet.arch.config import ModelConfig
from folnet.arch.inputs import check_ids, check_labels, check_mask, values_checked
from folnet.arch.kinds import register_kind
from folnet.arch.layer.atoms import Atoms, relative_position_ids, token_positions
from folnet.arch.layer.domain import Domain, visibility
from folnet.arch.layer.stack import Record, make_layers, run_stack
from folnet.arch.models.cache import GenerationCache
from folnet.arch.models.text import FACTS, Session, TextModel
from folnet.arch.objectives import seq2seq_loss, shift_right
from folnet.arch.outputs import TextOutput, recorded
from folnet.arch.plan import ArchPlan
from folnet.errors import FolnetError


@register_kind("encoder-decoder")
class FolnetEncoderDecoder(TextModel):
    """Encoder-decoder FOLNet: bidirectional encoder, causal dual-stream decoder whose binary
    atoms include the input->output relations (module docstring for the layout)."""

    decoder_start_token_id: int = 0

    def __init__(self, cfg: ModelConfig, head: str | None = None, num_labels: int = 2, *,
                 plan: ArchPlan | None = None):
        super().__init__(cfg, head, num_labels, plan=plan)
        self.encoder_atoms = Atoms(cfg)
        self.encoder_layers = make_layers(cfg, self.plan)
        word = self.encoder_atoms.embedding
        self.decoder_atoms = Atoms(cfg, token_types=False, shared_word=word)
        self.decoder_layers = make_layers(cfg, self.plan, causal=True, cross=True)
        self.add_head(word)
        self.reset_parameters()

    def word_embedding(self):
        return self.encoder_atoms.embedding

    def decoder_stack(self):
        return self.decoder_atoms, self.decoder_layers

    def encode(self, input_ids: torch.Tensor, pad: torch.Tensor | None = None,
               record: Record | None = None
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The encoder's final atoms (B, N, D1), (B, N, N, D2) (the decoder's cross context
        reads both) and its positions (B|1, N)."""
        N = input_ids.shape[1]
        types = torch.zeros_like(input_ids)
        positions = token_positions(pad, N, input_ids.device)
        rel = (relative_position_ids(types, self.cfg.delta, None if pad is None else positions)
               if self.cfg.relative_ids else None)  # (B, N, N)
        u1, u2 = run_stack(self.encoder_atoms, self.encoder_layers, input_ids, types,
                           Domain(n=N, pad=pad), positions, rel,
                           checkpointing=self.checkpointing, record=record)
        return u1, u2, positions

    def _domain(self, enc_positions: torch.Tensor, M: int, pad: torch.Tensor | None):
        """The decoder domain of N inputs then M targets: the domain, the targets' atom
        positions (1, n) (0.. from the first target) and the relative ids (B|1, n, n)."""
        N = enc_positions.shape[1]
        n, device = N + M, enc_positions.device
        targets = torch.arange(M, device=device)[None]  # (1, M)
        rel = self.rel_ids(torch.cat([enc_positions, N + targets.expand(
            enc_positions.shape[0], M)], 1), source=N)
        atoms = torch.cat([targets.new_zeros(1, N), targets], 1)  # (1, n)
        return Domain(n=n, pad=pad, visible=visibility(n, device, source=N)), atoms, rel

    def _contexts(self, e1: torch.Tensor, e2: torch.Tensor, M: int) -> list:
        """Per decoder layer: its own context rows after the encoder's projected ones."""
        hooks = []
        for layer in self.decoder_layers:
            cu, cb = layer.cross_context(e1, e2)  # (B, N, Wu), (B, N, N, Wb)

            def context(own_u, own_b, cu=cu, cb=cb):
                ctx_u = None if own_u is None else torch.cat([cu, own_u], 1)  # (B, n, Wu)
                ctx_b = None if own_b is None else torch.cat(
                    [F.pad(cb, (0, 0, 0, M)), own_b], 1)  # (B, n, n, Wb)
                return ctx_u, ctx_b

            hooks.append(context)
        return hooks

    def _decode(self, enc, dec_ids: torch.Tensor, pad: torch.Tensor | None, *,
                relations: bool = False, record: Record | None = None):
        """Decoder rows for dec_ids (B, M) after the N encoder rows, without a cache."""
        e1, e2, enc_positions = enc
        N, M = e1.shape[1], dec_ids.shape[1]
        domain, atoms, rel = self._domain(enc_positions, M, pad)
        domain = Domain(n=domain.n, pad=pad, visible=domain.visible,
                        rows=torch.arange(N, N + M, device=dec_ids.device))
        return run_stack(self.decoder_atoms, self.decoder_layers, dec_ids, None, domain,
                         atoms[:, N:], None if rel is None else rel[:, N:],
                         relations=relations, contexts=self._contexts(e1, e2, M),
                         checkpointing=self.checkpointing, record=record)

    @staticmethod
    def _domain_pad(enc_pad, dec_pad, B: int, N: int, M: int, device: torch.device):
        """The padding mask of the domain (B, N + M), or None when nothing is padded."""
        if enc_pad is None and dec_pad is None:
            return None
        ones = torch.ones(B, N + M, dtype=torch.bool, device=device)
        parts = [enc_pad if enc_pad is not None else ones[:, :N],
                 dec_pad if dec_pad is not None else ones[:, :M]]
        return torch.cat(parts, dim=1)

    def forward(self, input_ids: torch.Tensor, decoder_input_ids: torch.Tensor | None = None,
                labels: torch.Tensor | None = None, attention_mask: torch.Tensor | None = None,
                decoder_attention_mask: torch.Tensor | None = None, *,
                output_relations: bool | None = None, output_hidden_states: bool = False,
                output_attentions: bool = False, lm_head: bool = True) -> TextOutput:
        """input_ids (B, N), decoder_input_ids (B, M) -> logits (B, M, V) for the token after
        each decoder position (``lm_head=False``: the final states only, no logits or loss).
        ``labels`` (B, M) are the targets themselves (-100 ignored);
        without decoder_input_ids they are shifted right behind ``decoder_start_token_id``.
        ``output_relations`` (the decoder's final binary stream), ``output_hidden_states``,
        ``output_attentions``: as the encoder's, for both stacks."""
        values = isinstance(input_ids, torch.Tensor) and values_checked(input_ids, self.validate)
        ids = check_ids(self.cfg, input_ids, values=values)
        if decoder_input_ids is None:
            if labels is None:
                raise FolnetError("give decoder_input_ids, or labels to derive them from")
            check_labels(labels, tuple(labels.shape))
            decoder_input_ids = shift_right(labels, self.decoder_start_token_id)
        dec = check_ids(self.cfg, decoder_input_ids, "decoder_input_ids", values=values)
        if dec.shape[0] != ids.shape[0]:
            raise FolnetError(f"decoder_input_ids have {dec.shape[0]} rows but input_ids have "
                              f"{ids.shape[0]}")
        if labels is not None:
            check_labels(labels, tuple(dec.shape))
        enc_pad = check_mask(attention_mask, ids, values=values)
        dec_pad = check_mask(decoder_attention_mask, dec, "decoder_attention_mask",
                             "decoder_input_ids", values=values)
        enc_record = Record.asked(output_hidden_states, True, output_attentions)
        enc = self.encode(ids, enc_pad, enc_record)
        out = self._decoded(enc, enc_pad, dec, dec_pad, labels, output_relations,
                            output_hidden_states, output_attentions, lm_head=lm_head)
        for name, value in recorded(enc_record, "encoder_").items():
            setattr(out, name, value)
        return out

    def decode(self, encoded: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
               decoder_input_ids: torch.Tensor, *, attention_mask: torch.Tensor | None = None,
               decoder_attention_mask: torch.Tensor | None = None,
               output_relations: bool | None = None, output_hidden_states: bool = False,
               output_attentions: bool = False) -> TextOutput:
        """The decoder over inputs already encoded (`encode`'s atoms and positions; their
        padding ``attention_mask`` (B, N)), without a cache: what transformers' generate runs
        at each step with ``use_cache=False``."""
        e1 = encoded[0]
        dec = check_ids(self.cfg, decoder_input_ids, "decoder_input_ids")
        if dec.shape[0] != e1.shape[0]:
            raise FolnetError(f"decoder_input_ids have {dec.shape[0]} rows but the encoded "
                              f"inputs have {e1.shape[0]}")
        shape = torch.empty(e1.shape[:2], dtype=torch.long, device=e1.device)
        enc_pad = check_mask(attention_mask, shape)
        dec_pad = check_mask(decoder_attention_mask, dec, "decoder_attention_mask",
                             "decoder_input_ids")
        return self._decoded(encoded, enc_pad, dec, dec_pad, None, output_relations,
                             output_hidden_states, output_attentions)

    def _decoded(self, enc, enc_pad, dec, dec_pad, labels, output_relations,
                 output_hidden_states, output_attentions, *, lm_head: bool = True
                 ) -> TextOutput:
        relations = self.relations if output_relations is None else bool(output_relations)
        record = Record.asked(output_hidden_states, relations, output_attentions)
        pad = self._domain_pad(enc_pad, dec_pad, dec.shape[0], enc[0].shape[1], dec.shape[1],
                               dec.device)
        u1, u2 = self._decode(enc, dec, pad, relations=relations, record=record)
        logits = self.lm(u1) if lm_head else None  # (B, M, V)
        loss = None if labels is None or logits is None else seq2seq_loss(logits, labels)
        return TextOutput(logits=logits, sequence_output=u1, relation_output=u2, loss=loss,
                          encoder_sequence_output=enc[0], encoder_relation_output=enc[1],
                          **recorded(record))

    @torch.no_grad()
    def generate(self, input_ids: torch.Tensor, max_new_tokens: int, do_sample: bool = False,
                 temperature: float = 1.0, top_k: int | None = None,
                 generator: torch.Generator | None = None, *,
                 attention_mask: torch.Tensor | None = None,
                 decoder_start_token_id: int | None = None, use_cache: bool = True,
                 eos_token_id: int | None = None, pad_token_id: int | None = None,
                 return_logits: bool = False, cache: str = "dynamic",
                 compile: bool | str = False):
        """Decode ``max_new_tokens`` tokens for every input row: (B, 1 + new) ids starting with
        the decoder start token, or a `GenerationOutput` when ``return_logits``. The encoder
        runs once; ``use_cache=False`` recomputes encoder and decoder at each step;
        ``cache`` and ``compile``: as the decoder's (`FolnetDecoderLM.generate`)."""
        ids = check_ids(self.cfg, input_ids)
        B = ids.shape[0]
        start_id = (self.decoder_start_token_id if decoder_start_token_id is None
                    else decoder_start_token_id)
        self.check_generation(1, "decoder start token", max_new_tokens=max_new_tokens,
                              do_sample=do_sample, temperature=temperature, top_k=top_k,
                              eos_token_id=eos_token_id, pad_token_id=pad_token_id,
                              cache=cache, compile=compile, use_cache=use_cache)
        if not isinstance(start_id, int) or not 0 <= start_id < self.cfg.vocab_size:
            raise FolnetError(f"decoder_start_token_id must be an id in [0, vocab_size = "
                              f"{self.cfg.vocab_size}), got {start_id!r}")
        enc_pad = check_mask(attention_mask, ids)
        start = torch.full((B, 1), start_id, dtype=ids.dtype, device=ids.device)
        if use_cache:
            first, session = self.begin(ids, enc_pad, start,
                                        capacity=ids.shape[1] + 1 + max_new_tokens,
                                        static=cache == "static", compile=compile)
            first = first[:, -1]

            def step(tokens):
                return session.step(tokens[:, None])[:, -1]
        else:
            seq = [start]

            def logits_now():
                dec = torch.cat(seq, dim=1)
                pad = self._domain_pad(enc_pad, None, B, ids.shape[1], dec.shape[1],
                                       ids.device)
                return self.lm(self._decode(self.encode(ids, enc_pad), dec, pad)[0][:, -1])

            def step(tokens):
                seq.append(tokens[:, None])
                return logits_now()

            first = logits_now()
        return self.finish(start, first, step, max_new_tokens, return_logits,
                           do_sample=do_sample, temperature=temperature, top_k=top_k,
                           generator=generator, eos_token_id=eos_token_id,
                           pad_token_id=pad_token_id)

    def _facts(self, capacity: int, rows: dict) -> tuple:
        """The decoder domain's facts for ``capacity`` positions (the N inputs, then targets)
        from the encoder's padding and positions."""
        enc_pad, enc_positions = rows["enc_pad"], rows["enc_positions"]
        M = capacity - enc_positions.shape[1]
        pad = None if enc_pad is None else torch.cat(
            [enc_pad, enc_pad.new_ones(enc_pad.shape[0], M)], dim=1)  # (B, capacity)
        domain, atoms, rel = self._domain(enc_positions, M, pad)
        return domain.visible, pad, atoms, rel

    def begin(self, ids: torch.Tensor | None, enc_pad: torch.Tensor | None,
              start: torch.Tensor, *, capacity: int | None = None,
              encoded: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
              record: Record | None = None, static: bool = False,
              compile: bool | str = False) -> tuple[torch.Tensor, Session]:
        """Start a cached generation: encode ``ids`` (B, N) (checked inputs; or take the
        ``encoded`` atoms and positions of `encode`), store every decoder layer's cross context
        for the N input positions, run the decoder rows ``start`` (B, M0) (the decoder start
        token). Returns their next-token logits (B, M0, V) and the `Session` that continues
        the generation (``capacity``: N + M0 by default, doubled when full)."""
        e1, e2, enc_positions = encoded if encoded is not None else self.encode(ids, enc_pad)
        B, N = e1.shape[:2]
        rows = {"enc_pad": enc_pad, "enc_positions": enc_positions}
        capacity = max(capacity or 0, N + start.shape[1])
        cache = GenerationCache(self.decoder_layers, batch=B, capacity=capacity,
                                **dict(zip(FACTS, self._facts(capacity, rows), strict=True)),
                                dtype=e1.dtype, device=e1.device, static=static)
        for i, layer in enumerate(self.decoder_layers):
            cache.write(i, 0, *layer.cross_context(e1, e2))
        first = self.lm(self.step_rows(cache, start, N, record))
        return first, Session(self, cache, self._facts, rows, floor=N,
                              static_step=self.static_step_fn(compile) if static else None)
