"""Text-to-text FOLNets (paper Appendix A.5): a decoder-only LM and an encoder-decoder.

Decoder-only (`FolnetDecoderLM`): the dual-branch stack of `folnet.arch.decoder.DecoderLayer`
over one sequence, causal (CausalLM) or with a bidirectional prefix per row (PrefixLM,
``prefix_lengths``); the LM head (the MLM head's transform with the decoder tied to the word
embedding) predicts the next token from every position.

Encoder-decoder (`FolnetEncoderDecoder`): the bidirectional encoder stack on the N input tokens
(exactly the encoder-only FOLNet, without pooler), then a decoder stack whose atoms are the rows
of the M target tokens in the domain "inputs then targets" (n = N + M positions):

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

Both share `generate` (greedy or sampled, with the incremental cache of `folnet.arch.kvcache`).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from folnet.arch.config import ModelConfig, make_config
from folnet.arch.decoder import DecoderLayer
from folnet.arch.encdec import FolnetEncoderDecoder
from folnet.arch.heads import MLMHead
from folnet.arch.kvcache import GenerationCache
from folnet.arch.objectives import lm_loss
from folnet.arch.plan import parse_plan
from folnet.arch.t2t_common import (
    DecoderAtoms,
    TextModel,
    TextOutput,
    check_ids,
    check_labels,
    check_mask,
    check_prefix,
    domain_rel_ids,
    visibility,
)
from folnet.errors import FolnetError
from folnet.ops.registry import is_builtin
from folnet.ops.spec import spec_to_dict

__all__ = ["FolnetDecoderLM", "FolnetEncoderDecoder", "TextOutput", "build", "from_config"]


class FolnetDecoderLM(TextModel):
    """Decoder-only FOLNet language model (CausalLM, or PrefixLM with ``prefix_lengths``)."""

    def __init__(self, cfg: ModelConfig, head: str | None = None):
        super().__init__()
        self._setup(cfg, "decoder", head)
        self.atoms = DecoderAtoms(cfg)
        self.layers = nn.ModuleList(DecoderLayer(lp, cfg) for lp in self.plan.layers)
        self.lm = MLMHead(cfg, self.atoms.word)
        self.reset_parameters()

    def _run(self, ids, visible, rel_ids, pad, *, collect=False):
        T = ids.shape[1]
        pos = torch.arange(T, device=ids.device)
        u1, u2 = self.atoms(ids, pos, rel_ids, visible)  # (B, T, D1), (B, T, T, D2)
        ctx = []
        for layer in self.layers:
            u1, u2, c = layer.forward_square(u1, u2, visible, pad, collect=collect)
            ctx.append(c)
        u1, u2 = self._final(u1, u2)
        return u1, u2, ctx

    def forward(self, input_ids: torch.Tensor, prefix_lengths: torch.Tensor | int | None = None,
                labels: torch.Tensor | None = None,
                attention_mask: torch.Tensor | None = None) -> TextOutput:
        """input_ids (B, T) -> next-token logits (B, T, V). ``prefix_lengths`` (B,) makes row
        b's first prefix_lengths[b] tokens see each other; ``labels`` (B, T) (usually the
        input ids, -100 to ignore) gives ``.loss``, the next-token cross-entropy over the
        target positions (after the prefix); ``attention_mask`` (B, T) marks real tokens."""
        ids = check_ids(self.cfg, input_ids)
        B, T = ids.shape
        pad = check_mask(attention_mask, ids, "attention_mask")
        prefix = check_prefix(prefix_lengths, B, T, ids.device)
        if labels is not None:
            check_labels(labels, (B, T))
        visible = visibility(T, ids.device, prefix)  # (B|1, T, T)
        u1, u2, _ = self._run(ids, visible, domain_rel_ids(self.cfg, T, ids.device), pad)
        logits = self._logits(u1)  # (B, T, V)
        loss = None if labels is None else lm_loss(logits, labels, prefix)
        return TextOutput(logits=logits, sequence_output=u1, relation_output=u2, loss=loss)

    @torch.no_grad()
    def generate(self, input_ids: torch.Tensor, max_new_tokens: int, do_sample: bool = False,
                 temperature: float = 1.0, top_k: int | None = None,
                 generator: torch.Generator | None = None, *,
                 prefix_lengths: torch.Tensor | int | None = None,
                 attention_mask: torch.Tensor | None = None, use_cache: bool = True,
                 eos_token_id: int | None = None, pad_token_id: int | None = None,
                 return_logits: bool = False):
        """Continue every prompt row by ``max_new_tokens`` tokens: (B, T0 + new) ids, or a
        `GenerationOutput` with the logits when ``return_logits``. Call ``model.eval()`` first.

        Prompts share one length T0; pad shorter ones on the left and mark them in
        ``attention_mask``. ``prefix_lengths`` makes (part of) the prompt a PrefixLM prefix.
        ``use_cache=False`` recomputes the whole sequence at each step (the reference)."""
        ids = check_ids(self.cfg, input_ids)
        B, T0 = ids.shape
        self._generation_args(T0, "prompt tokens", max_new_tokens=max_new_tokens,
                              do_sample=do_sample, temperature=temperature, top_k=top_k,
                              eos_token_id=eos_token_id, pad_token_id=pad_token_id)
        pad = check_mask(attention_mask, ids, "attention_mask")
        prefix = check_prefix(prefix_lengths, B, T0, ids.device)
        cap = T0 + max_new_tokens
        visible = visibility(cap, ids.device, prefix)  # (B|1, cap, cap)
        rel = domain_rel_ids(self.cfg, cap, ids.device)  # (1, cap, cap)
        if pad is not None:
            pad = torch.cat([pad, pad.new_ones(B, max_new_tokens)], dim=1)  # (B, cap)
        session = self._cached if use_cache else self._recomputed
        first, step = session(ids, visible, rel, pad)
        return self._finish(ids, first, step, max_new_tokens, return_logits, do_sample=do_sample,
                            temperature=temperature, top_k=top_k, generator=generator,
                            eos_token_id=eos_token_id, pad_token_id=pad_token_id)

    def _recomputed(self, ids, visible, rel, pad):
        seq = [ids]

        def logits_now():
            full = torch.cat(seq, dim=1)
            n = full.shape[1]
            u1, _, _ = self._run(full, visible[:, :n, :n], None if rel is None else
                                 rel[:, :n, :n], None if pad is None else pad[:, :n])
            return self._logits(u1[:, -1])  # (B, V)

        def step(tokens):
            seq.append(tokens[:, None])
            return logits_now()

        return logits_now(), step

    def _cached(self, ids, visible, rel, pad):
        B, T0 = ids.shape
        cap = visible.shape[-1]
        cache = GenerationCache(self.layers, batch=B, capacity=cap, visible=visible,
                                rel_ids=rel, pad=pad, dtype=self.lm.bias.dtype,
                                device=ids.device)
        vis, p = cache.masks(T0)
        u1, _, ctx = self._run(ids, vis, None if rel is None else rel[:, :T0, :T0], p,
                               collect=True)
        for i, (cu, cb) in enumerate(ctx):
            cache.write(i, 0, cu, cb)
        cache.length = T0

        def step(tokens):
            return self._logits(self._step_rows(cache, tokens[:, None], cache.length, 0)[:, -1])

        return self._logits(u1[:, -1]), step

    def _decoder(self):
        return self.atoms, self.layers


def from_config(cfg: ModelConfig, head: str | None = None) -> nn.Module:
    """The text-to-text model a config describes (used by `folnet.from_pretrained`)."""
    if cfg.kind == "decoder":
        return FolnetDecoderLM(cfg, head)
    if cfg.kind == "encoder-decoder":
        return FolnetEncoderDecoder(cfg, head)
    raise FolnetError(f"kind {cfg.kind!r} is not a text-to-text kind; use 'decoder' or "
                      f"'encoder-decoder'")


def build(ops: str = "jmc.atp", *, preset: str = "base", kind: str = "decoder",
          head: str | None = None, **overrides: Any) -> nn.Module:
    """`folnet.build_model` for ``kind="decoder"`` or ``"encoder-decoder"``."""
    cfg = make_config(ops, preset_name=preset, kind=kind, overrides=overrides)
    plan = parse_plan(cfg.ops, cfg.L)
    custom = tuple(tuple(sorted(spec_to_dict(s).items())) for s in plan.specs
                   if not is_builtin(s.symbol))
    return from_config(cfg.replace(ops=str(plan), operators=custom), head=head)
