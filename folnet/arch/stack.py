"""One FOLNet stack: base atoms -> L dual-stream layers -> final LayerNorm on both streams.

Encoders, decoders and the encoder-decoder are thin variants of it (`folnet.arch.models`): a
stack is causal or not, reads token types or not, may share its word embedding, may own the
pooler, and its causal layers may read an encoder's context (``cross``).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
import torch.utils.checkpoint
from torch import nn

from folnet.arch.atoms import Atoms
from folnet.arch.config import ModelConfig
from folnet.arch.domain import ContextHook, Domain
from folnet.arch.layer import DualStreamLayer
from folnet.arch.plan import ArchPlan


class Stack(nn.Module):
    """Base atoms, the layers of ``plan``, the final norms (and the pooler, if owned)."""

    def __init__(self, cfg: ModelConfig, plan: ArchPlan, *, causal: bool = False,
                 cross: bool = False, token_types: bool = True,
                 shared_word: nn.Embedding | None = None, pooler: bool = False):
        super().__init__()
        self.cfg = cfg
        self.plan = plan
        self.atoms = Atoms(cfg, token_types=token_types, shared_word=shared_word)
        self.layers = nn.ModuleList(DualStreamLayer(lp, cfg, causal=causal, cross=cross)
                                    for lp in plan.layers)
        self.pooler = nn.Linear(cfg.D1, cfg.D1) if pooler else None
        self.checkpointing = False

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None,
                domain: Domain, positions: torch.Tensor, rel_ids: torch.Tensor | None = None,
                *, relations: bool = True, contexts: Sequence[ContextHook] | None = None
                ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """ids (B, Q) at ``positions`` (B|1, Q) of ``domain`` -> final unary atoms (B, Q, D1)
        and binary atoms (B, Q, n, D2). ``rel_ids`` (B|1, Q, n) start the binary stream under
        RPE; ``contexts`` gives each causal layer its context hook. With ``relations=False``
        the last layer skips its binary-stream updates (nothing would read them) and the
        binary atoms come back None."""
        cfg = self.cfg
        u1, u2 = self.atoms(input_ids, token_type_ids, positions, rel_ids, domain.n,
                            domain.keep())
        last = len(self.layers) - 1
        for i, layer in enumerate(self.layers):
            kw = {"unary_only": not relations and i == last,
                  "context": None if contexts is None else contexts[i]}
            if self.checkpointing and self.training:
                u1, u2 = torch.utils.checkpoint.checkpoint(layer, u1, u2, domain,
                                                           use_reentrant=False, **kw)
            else:
                u1, u2 = layer(u1, u2, domain, **kw)
        u1 = F.layer_norm(u1, (cfg.D1,), eps=cfg.layer_norm_eps)
        if u2 is not None:  # LN(0) = 0: a causal stack's binary atoms stay masked
            u2 = F.layer_norm(u2, (cfg.D2,), eps=cfg.layer_norm_eps)
        return u1, u2

    def pool(self, u1: torch.Tensor) -> torch.Tensor:
        """tanh(Linear) of token 0: (B, D1)."""
        return torch.tanh(self.pooler(u1[:, 0]))
