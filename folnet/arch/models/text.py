"""What the text-to-text FOLNets share (paper Appendix A.5): the tied LM head, relative ids of
a causal domain, cached-row stepping and the decoding loop around it."""

from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar

import torch
from torch import nn

from folnet.arch import generation
from folnet.arch.config import ModelConfig
from folnet.arch.layer.atoms import Atoms, relative_position_ids
from folnet.arch.layer.stack import Record, run_stack
from folnet.arch.models.base import FolnetBase
from folnet.arch.models.cache import GenerationCache
from folnet.arch.plan import ArchPlan
from folnet.errors import FolnetError

#: ``facts(capacity, rows)`` -> the domain's (visible, pad, positions, rel_ids) for
#: ``capacity`` positions, from the per-row inputs ``rows`` (a generation's prompt padding,
#: prefix lengths, encoder positions...).
FACTS = ("visible", "pad", "positions", "rel_ids")  # what a Facts function returns, in order
Facts = Callable[[int, dict[str, torch.Tensor | None]],
                 tuple[torch.Tensor, torch.Tensor | None, torch.Tensor, torch.Tensor | None]]


class Session:
    """A generation in progress: the incremental cache (`GenerationCache`), the per-row inputs
    its domain facts come from, and how to make those facts for a larger capacity.

    Made by a model's ``begin`` (which also returns the logits of the first rows).
    ``step(tokens)`` appends tokens (B, k) to every row and returns their next-token logits
    (B, k, V), each new token costing one row per layer; the cache doubles when full, so a
    caller need not know the final length (transformers' generate does not say).
    ``reorder(index)`` keeps the batch rows ``index`` in that order (beam search);
    ``crop(length)`` forgets the positions from ``length`` on (assisted decoding drops the
    candidate tokens the model rejected). ``floor`` positions can never be forgotten: an
    encoder-decoder's inputs (not tokens a step could feed again) and a PrefixLM's prompt (its
    rows see each other both ways, so a row stepped again would change the rows before it)."""

    def __init__(self, model: TextModel, cache: GenerationCache, facts: Facts,
                 rows: dict[str, torch.Tensor | None], *,
                 floor: int | Callable[[dict[str, torch.Tensor | None]], int] = 0,
                 static_step: Callable | None = None):
        self.model, self.cache, self.facts, self.rows = model, cache, facts, rows
        self._floor_of, self._floor = floor, None
        # a static cache's step (`TextModel.step_static`, maybe compiled) and the positions
        # of the one row it takes, a buffer filled in place (a CUDA graph reads its address)
        self._static_step = static_step or model.step_static
        self._at = torch.zeros(1, dtype=torch.long, device=cache.visible.device)

    @property
    def floor(self) -> int:
        """Positions a crop keeps: given, or computed from the rows when first asked after
        they were last reordered, so that only a generation that crops reads values on the
        host."""
        if self._floor is None:
            of = self._floor_of
            self._floor = of(self.rows) if callable(of) else of
        return self._floor

    @property
    def length(self) -> int:
        """Positions of the domain so far (an encoder-decoder's inputs included)."""
        return self.cache.length

    def step(self, tokens: torch.Tensor, record: Record | None = None) -> torch.Tensor:
        """Append ``tokens`` (B, k) to every row: their next-token logits (B, k, V). The cache
        keeps a free position after the last one: a view of every buffer row would have other
        strides than the views before it, and torch.compile would compile the step again."""
        n = self.cache.length + tokens.shape[1]
        if self.cache.static and record is None:
            if n > self.cache.capacity:
                self.cache.grow(n, *self.facts(n, self.rows))  # refused: it names the sizes
            if tokens.shape[1] == 1:
                rows = self._at.fill_(self.cache.length)  # (1,): no host copy, one kernel
            else:
                rows = torch.arange(self.cache.length, n, device=self._at.device)
            logits = self._static_step(self.cache, tokens, rows)
            self.cache.length = n
            return logits
        if n >= self.cache.capacity:
            capacity = max(n + 1, 2 * self.cache.capacity)
            self.cache.grow(capacity, *self.facts(capacity, self.rows))
        return self.model.lm(self.model.step_rows(self.cache, tokens, self.cache.length,
                                                  record))

    def crop(self, length: int) -> None:
        """Keep the first ``length`` positions (``floor <= length``): the next step continues
        as a session that never saw the others. Nothing is cleared or copied: a step writes
        every context row from its start on (the binary ones over all their columns), and a
        kept row's binary columns after ``length`` are zero (a causal row does not see them),
        so no forgotten value is ever read."""
        if isinstance(length, bool) or not isinstance(length, int) or length < self.floor:
            raise FolnetError(f"crop: length must be an integer >= {self.floor} (the positions "
                              f"a step cannot recompute: an encoder-decoder's inputs, a "
                              f"PrefixLM's prompt), got {length!r}")
        self.cache.length = min(length, self.cache.length)

    def reorder(self, index: torch.Tensor) -> None:
        batch = self.cache.batch
        self.rows = {k: v if v is None or v.shape[0] != batch else v.index_select(0, index)
                     for k, v in self.rows.items()}
        self._floor = None  # the floor of the rows kept
        self.cache.reorder(index)


class TextModel(FolnetBase):
    """A model with a causal decoder stack (`decoder_stack`) and the tied LM head."""

    default_head: ClassVar[str | None] = "lm"

    def decoder_stack(self) -> tuple[Atoms, nn.ModuleList]:
        """The causal stack's atoms and layers."""
        raise NotImplementedError

    def __init__(self, cfg: ModelConfig, head: str | None = None, num_labels: int = 2, *,
                 plan: ArchPlan | None = None):
        if cfg.position == "rpe*":
            raise FolnetError(f"position 'rpe*' is not supported by {cfg.kind}s; use 'rpe', "
                              f"'ape', 'ape+rpe' or 'none'")
        super().__init__(cfg, head, cfg.vocab_size, plan=plan)
        # compute relation_output (the final binary stream) when a call does not say: off, as
        # the encoder's (`folnet.arch.models.encoder.FolnetModel`)
        self.relations = False

    def rel_ids(self, positions: torch.Tensor, source: int = 0) -> torch.Tensor | None:
        """Clipped relative-distance ids (B|1, n, n) of a causal domain at ``positions``
        (B|1, n); the encoder-decoder's input positions (the first ``source``) form segment 0
        and the targets segment 1, so every input->output relation starts from the 'different
        segment' id."""
        if not self.cfg.relative_ids:
            return None
        types = torch.zeros(1, positions.shape[1], dtype=torch.long, device=positions.device)
        if source:
            types[:, source:] = 1
        return relative_position_ids(types, self.cfg.delta, positions)

    def step_static(self, cache: GenerationCache, tokens: torch.Tensor, rows: torch.Tensor
                    ) -> torch.Tensor:
        """`step_rows` on a static cache: new rows (B, Q) at domain positions ``rows`` (Q,),
        a tensor, against every position of the capacity. Its shapes never change, so
        ``torch.compile(fullgraph=True, mode="reduce-overhead")`` captures it once: the
        decoding step a GPU replays (`Session.step` calls it for a static cache). Returns the
        rows' next-token logits (B, Q, V)."""
        domain, positions, rel = cache.static_step(rows)
        atoms, layers = self.decoder_stack()
        hooks = [cache.hook(i, rows, read=True) for i in range(len(layers))]
        u1, _ = run_stack(atoms, layers, tokens, None, domain, positions, rel,
                          relations=False, contexts=hooks)  # (B, Q, D1)
        return self.lm(u1)

    def step_rows(self, cache: GenerationCache, tokens: torch.Tensor, start: int,
                  record: Record | None = None) -> torch.Tensor:
        """Run new decoder rows (B, Q) at domain positions ``start..`` through every layer,
        storing their context channels in the cache; returns their final unary atoms (and
        fills ``record``, `folnet.arch.layer.stack.Record`, for those rows)."""
        n = start + tokens.shape[1]
        positions, rel = cache.atoms_at(start, n)
        atoms, layers = self.decoder_stack()
        hooks = [cache.hook(i, start, read=True) for i in range(len(layers))]
        u1, _ = run_stack(atoms, layers, tokens, None, cache.domain(n, start), positions, rel,
                          relations=False, contexts=hooks, record=record)  # (B, Q, D1)
        cache.length = n
        return u1

    def check_generation(self, used: int, what: str, *, cache: str = "dynamic",
                         compile: bool | str = False, use_cache: bool = True, **kw) -> None:
        generation.check_generation_args(used=used, limit=self.cfg.max_positions, what=what,
                                         vocab_size=self.cfg.vocab_size, **kw)
        generation.check_cache_args(cache=cache, compile=compile, use_cache=use_cache)

    def static_step_fn(self, compile: bool | str = False) -> Callable:
        """`step_static`, or (``compile``: True, or a torch.compile mode) it compiled with
        ``fullgraph=True`` -- True takes "reduce-overhead" (CUDA graphs) on CUDA, "default"
        elsewhere -- kept on the model, so later generations reuse the compiled step."""
        if compile is False:
            return self.step_static
        if compile is True:
            compile = "reduce-overhead" if self.lm.bias.device.type == "cuda" else "default"
        kept = self.__dict__.setdefault("_compiled_steps", {})
        if compile not in kept:
            kept[compile] = torch.compile(self.step_static, fullgraph=True, mode=compile)
        return kept[compile]

    @staticmethod
    def finish(prompt, first, step, max_new_tokens, return_logits, **kw):
        new, logits = generation.decode(first, step, max_new_tokens, **kw)
        sequences = torch.cat([prompt, new], dim=1)
        return generation.GenerationOutput(sequences, logits) if return_logits else sequences
