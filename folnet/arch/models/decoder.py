"""The decoder-only FOLNet language model (paper Appendix A.5): one causal stack over the
sequence -- CausalLM, or PrefixLM with a bidirectional prefix per row (``prefix_lengths``) --
and the LM head (the MLM head's transform, decoder tied to the word embedding) predicting the
next token from every position. A row padded on the left (pads marked in ``attention_mask``)
gives the logits and tokens of the same row unpadded: positions count from its first real
token."""

from __future__ import annotations

import functools

import torch

from folnet.arch.config import ModelConfig
from folnet.arch.inputs import (
    check_ids,
    check_labels,
    check_mask,
    check_prefix,
    values_checked,
)
from folnet.arch.kinds import register_kind
from folnet.arch.layer.atoms import Atoms, token_positions
from folnet.arch.layer.domain import Domain, visibility
from folnet.arch.layer.stack import Record, make_layers, run_stack
from folnet.arch.models.cache import GenerationCache
from folnet.arch.models.text import FACTS, Session, TextModel
from folnet.arch.objectives import lm_loss
from folnet.arch.outputs import TextOutput, recorded
from folnet.arch.packed import (
    check_documents,
    document_labels,
    document_positions,
    document_visibility,
)
from folnet.arch.plan import ArchPlan
from folnet.errors import FolnetError


@register_kind("decoder")
class FolnetDecoderLM(TextModel):
    """Decoder-only FOLNet language model (CausalLM, or PrefixLM with ``prefix_lengths``)."""

    def __init__(self, cfg: ModelConfig, head: str | None = None, num_labels: int = 2, *,
                 plan: ArchPlan | None = None):
        super().__init__(cfg, head, num_labels, plan=plan)
        self.atoms = Atoms(cfg, token_types=False)
        self.layers = make_layers(cfg, self.plan, causal=True)
        self.add_head(self.atoms.embedding)
        self.reset_parameters()

    def word_embedding(self):
        return self.atoms.embedding

    def decoder_stack(self):
        return self.atoms, self.layers

    def _run(self, ids, domain, positions, rel, contexts=None, *, relations=False, record=None):
        return run_stack(self.atoms, self.layers, ids, None, domain, positions, rel,
                         relations=relations, contexts=contexts,
                         checkpointing=self.checkpointing, record=record)

    def _domain(self, n: int, pad: torch.Tensor | None, prefix: torch.Tensor | None,
                device: torch.device, documents: torch.Tensor | None = None):
        """The domain of n positions, the atoms' positions (B|1, n) and relative ids; packed
        rows' ``documents`` (B, n) make each piece its own causal block
        (`folnet.arch.packed`)."""
        if documents is not None:
            positions, visible = document_positions(documents), document_visibility(documents)
        else:
            positions = token_positions(pad, n, device)
            visible = visibility(n, device, prefix, positions=positions)  # (B|1, n, n)
        return Domain(n=n, pad=pad, visible=visible), positions, self.rel_ids(positions)

    def forward(self, input_ids: torch.Tensor, prefix_lengths: torch.Tensor | int | None = None,
                labels: torch.Tensor | None = None,
                attention_mask: torch.Tensor | None = None, *,
                document_ids: torch.Tensor | None = None,
                output_relations: bool | None = None, output_hidden_states: bool = False,
                output_attentions: bool = False, lm_head: bool = True) -> TextOutput:
        """input_ids (B, T) -> next-token logits (B, T, V) (``lm_head=False``: the final
        states only, no logits or loss -- what the base model of `folnet.hf` returns).
        ``prefix_lengths`` (B,) makes row b's first prefix_lengths[b] tokens see each other;
        ``labels`` (B, T) (usually the input ids, -100 to ignore) gives ``.loss``, the
        next-token cross-entropy over the target positions (after the prefix);
        ``attention_mask`` (B, T) marks real tokens.
        ``document_ids`` (B, T) packs several documents in a row, each piece seeing only
        itself and predicting only its own tokens (`folnet.arch.packed`; not with
        ``prefix_lengths``, nor left padding: pads come last, with an id of their own).
        ``output_relations``, ``output_hidden_states``, ``output_attentions``: as the
        encoder's (`folnet.arch.models.encoder.FolnetModel.forward`)."""
        values = isinstance(input_ids, torch.Tensor) and values_checked(input_ids, self.validate)
        ids = check_ids(self.cfg, input_ids, values=values)
        B, T = ids.shape
        pad = check_mask(attention_mask, ids, values=values)
        prefix = check_prefix(prefix_lengths, B, T, ids.device, values=values)
        if labels is not None:
            check_labels(labels, (B, T))
        if document_ids is not None:
            if prefix is not None:
                raise FolnetError("document_ids and prefix_lengths cannot be given together: a "
                                  "packed row's pieces are causal documents of their own")
            document_ids = check_documents(document_ids, (B, T)).to(ids.device)
            if labels is not None:
                labels = document_labels(labels, document_ids)
        domain, positions, rel = self._domain(T, pad, prefix, ids.device, document_ids)
        relations = self.relations if output_relations is None else bool(output_relations)
        record = Record.asked(output_hidden_states, relations, output_attentions)
        u1, u2 = self._run(ids, domain, positions, rel, relations=relations, record=record)
        if not lm_head:
            return TextOutput(sequence_output=u1, relation_output=u2, **recorded(record))
        logits = self.lm(u1)  # (B, T, V)
        loss = None if labels is None else lm_loss(logits, labels, prefix, positions)
        return TextOutput(logits=logits, sequence_output=u1, relation_output=u2, loss=loss,
                          **recorded(record))

    @torch.no_grad()
    def generate(self, input_ids: torch.Tensor, max_new_tokens: int, do_sample: bool = False,
                 temperature: float = 1.0, top_k: int | None = None,
                 generator: torch.Generator | None = None, *,
                 prefix_lengths: torch.Tensor | int | None = None,
                 attention_mask: torch.Tensor | None = None, use_cache: bool = True,
                 eos_token_id: int | None = None, pad_token_id: int | None = None,
                 return_logits: bool = False, cache: str = "dynamic",
                 compile: bool | str = False):
        """Continue every prompt row by ``max_new_tokens`` tokens: (B, T0 + new) ids, or a
        `GenerationOutput` with the logits when ``return_logits``. Call ``model.eval()`` first.

        Prompts share one length T0; pad shorter ones on the left and mark them in
        ``attention_mask``: each row then gets the tokens it would get alone.
        ``prefix_lengths`` makes (part of) the prompt a PrefixLM prefix. ``use_cache=False``
        recomputes the whole sequence at each step (the reference). ``cache="static"`` sizes
        the cache for the whole generation and steps over all of it: fixed shapes, which
        ``compile`` (True or a torch.compile mode) compiles once -- on CUDA into a CUDA graph
        replayed each token (`TextModel.static_step_fn`)."""
        ids = check_ids(self.cfg, input_ids)
        B, T0 = ids.shape
        self.check_generation(T0, "prompt tokens", max_new_tokens=max_new_tokens,
                              do_sample=do_sample, temperature=temperature, top_k=top_k,
                              eos_token_id=eos_token_id, pad_token_id=pad_token_id,
                              cache=cache, compile=compile, use_cache=use_cache)
        pad = check_mask(attention_mask, ids)
        prefix = check_prefix(prefix_lengths, B, T0, ids.device)
        if use_cache:
            first, session = self.begin(ids, pad, prefix, capacity=T0 + max_new_tokens,
                                        static=cache == "static", compile=compile)
            first = first[:, -1]

            def step(tokens):
                return session.step(tokens[:, None])[:, -1]
        else:
            first, step = self._recomputed(ids, pad, prefix, T0 + max_new_tokens)
        return self.finish(ids, first, step, max_new_tokens, return_logits, do_sample=do_sample,
                           temperature=temperature, top_k=top_k, generator=generator,
                           eos_token_id=eos_token_id, pad_token_id=pad_token_id)

    def _facts(self, capacity: int, rows: dict, *, device: torch.device) -> tuple:
        """The domain facts of ``capacity`` positions for a prompt's padding and prefixes: its
        pads, then real tokens only."""
        pad, prefix = rows["pad"], rows["prefix"]
        if pad is not None:  # (B, T0) -> (B, capacity)
            pad = torch.cat([pad, pad.new_ones(pad.shape[0], capacity - pad.shape[1])], dim=1)
        domain, positions, rel = self._domain(capacity, pad, prefix, device)
        return domain.visible, pad, positions, rel

    def begin(self, ids: torch.Tensor, pad: torch.Tensor | None = None,
              prefix: torch.Tensor | None = None, *, capacity: int | None = None,
              record: Record | None = None, static: bool = False,
              compile: bool | str = False) -> tuple[torch.Tensor, Session]:
        """Start a cached generation from prompts ``ids`` (B, T0) (checked inputs: ``pad``
        (B, T0) bool, ``prefix`` (B,)): the prompt's next-token logits (B, T0, V) and the
        `Session` that continues it. ``capacity`` sizes the cache (default: twice the
        prompt; it grows when full, but for a ``static`` one, whose steps take
        `static_step_fn` (``compile``)); ``record`` collects the prompt's per-layer states."""
        B, T0 = ids.shape
        rows = {"pad": pad, "prefix": prefix}
        facts = functools.partial(self._facts, device=ids.device)
        capacity = capacity or 2 * T0
        cache = GenerationCache(self.layers, batch=B, capacity=capacity,
                                **dict(zip(FACTS, facts(capacity, rows), strict=True)),
                                dtype=self.lm.bias.dtype, device=ids.device, static=static)
        u1 = self._prefix_run(ids, cache, store=True, record=record)
        cache.length = T0
        return self.lm(u1), Session(self, cache, facts, rows, floor=self._prefix_end,
                                    static_step=self.static_step_fn(compile) if static
                                    else None)

    @staticmethod
    def _prefix_end(rows: dict[str, torch.Tensor | None]) -> int:
        """Where the last PrefixLM prefix ends in the domain (each counted from its row's
        first real token): a crop keeps the positions before, whose rows see each other
        both ways (a row stepped again would change the rows before it)."""
        prefix, pad = rows["prefix"], rows["pad"]
        if prefix is None:
            return 0
        if pad is not None:  # (B,) + the pads before each row's first real token
            prefix = prefix + pad.to(torch.int8).argmax(dim=1)
        return int(prefix.max())

    def _prefix_run(self, ids: torch.Tensor, cache: GenerationCache, *, store: bool,
                    record: Record | None = None) -> torch.Tensor:
        """The full square of the first ``n`` tokens (storing their context when ``store``):
        final unary atoms (B, n, D1)."""
        n = ids.shape[1]
        positions, rel = cache.atoms_at(0, n)
        hooks = ([cache.hook(i, 0, read=False) for i in range(len(self.layers))]
                 if store else None)
        return self._run(ids, cache.domain(n), positions, rel, hooks, record=record)[0]

    def _recomputed(self, ids, pad, prefix, capacity):
        """Decoding that recomputes the whole square at each step (the reference)."""
        facts = self._facts(capacity, {"pad": pad, "prefix": prefix}, device=ids.device)
        cache = GenerationCache((), batch=ids.shape[0], capacity=capacity,
                                **dict(zip(FACTS, facts, strict=True)),
                                dtype=self.lm.bias.dtype, device=ids.device)
        seq = [ids]

        def step(tokens):
            seq.append(tokens[:, None])
            return self.lm(self._prefix_run(torch.cat(seq, dim=1), cache, store=False)[:, -1])

        return self.lm(self._prefix_run(ids, cache, store=False)[:, -1]), step
