"""What the text-to-text FOLNets share (paper Appendix A.5): the tied LM head, relative ids of
a causal domain, cached-row stepping and the decoding loop around it."""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import nn

from folnet.arch import generation
from folnet.arch.atoms import Atoms, relative_position_ids
from folnet.arch.config import ModelConfig
from folnet.arch.models.base import FolnetBase
from folnet.arch.models.cache import GenerationCache
from folnet.arch.plan import ArchPlan
from folnet.arch.stack import run_stack
from folnet.errors import FolnetError


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

    def step_rows(self, cache: GenerationCache, tokens: torch.Tensor, start: int
                  ) -> torch.Tensor:
        """Run new decoder rows (B, Q) at domain positions ``start..`` through every layer,
        storing their context channels in the cache; returns their final unary atoms."""
        n = start + tokens.shape[1]
        positions, rel = cache.atoms_at(start, n)
        atoms, layers = self.decoder_stack()
        hooks = [cache.hook(i, start, read=True) for i in range(len(layers))]
        u1, _ = run_stack(atoms, layers, tokens, None, cache.domain(n, start), positions, rel,
                          contexts=hooks)  # (B, Q, D1)
        cache.length = n
        return u1

    def check_generation(self, used: int, what: str, **kw) -> None:
        generation.check_generation_args(used=used, limit=self.cfg.max_positions, what=what,
                                         vocab_size=self.cfg.vocab_size, **kw)

    @staticmethod
    def finish(prompt, first, step, max_new_tokens, return_logits, **kw):
        new, logits = generation.decode(first, step, max_new_tokens, **kw)
        sequences = torch.cat([prompt, new], dim=1)
        return generation.GenerationOutput(sequences, logits) if return_logits else sequences
