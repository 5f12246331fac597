"""One FOLNet stack: base atoms -> L dual-stream layers -> final LayerNorm on both streams.

`run_stack` is the one implementation; `Stack` holds an encoder's atoms, layers and pooler
under the names its checkpoints use (``encoder.atoms``, ``encoder.layers``, ``encoder.pooler``).
The text models hold theirs under their own checkpoint names (``atoms``/``layers`` for the
decoder, ``encoder_atoms``/``decoder_layers``... for the encoder-decoder) and run the same
function over them. A stack is causal or not, reads token types or not, may share its word
embedding, and its causal layers may read an encoder's context (``cross``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.utils.checkpoint
from torch import nn

from folnet.arch.config import ModelConfig
from folnet.arch.layer import DualStreamLayer
from folnet.arch.layer.atoms import Atoms
from folnet.arch.layer.domain import ContextHook, Domain
from folnet.arch.plan import ArchPlan
from folnet.ops.primitives import layer_norm


def make_layers(cfg: ModelConfig, plan: ArchPlan, *, causal: bool = False,
                cross: bool = False) -> nn.ModuleList:
    """One `DualStreamLayer` per layer of the plan."""
    return nn.ModuleList(DualStreamLayer(lp, cfg, causal=causal, cross=cross)
                         for lp in plan.layers)


@dataclass(eq=False)
class Record:
    """The per-layer states a forward pass was asked for (transformers' output_hidden_states
    and output_attentions); a list is None when not asked for.

    ``hidden``: the unary stream after the atoms and after each layer but the last, then the
    final normalised stream (the sequence output): L + 1 tensors (B, Q, D1). ``relations``:
    the binary stream likewise, (B, Q, n, D2). ``attentions``: per layer, {operator symbol:
    its activated softmax kernel} (`folnet.ops.compiler.CompiledOperator.probabilities`)."""

    hidden: list[torch.Tensor] | None = None
    relations: list[torch.Tensor] | None = None
    attentions: list[dict[str, torch.Tensor]] | None = None

    @classmethod
    def asked(cls, hidden: bool, relations: bool, attentions: bool) -> Record | None:
        if not (hidden or attentions):
            return None
        return cls([] if hidden else None, [] if hidden and relations else None,
                   [] if attentions else None)

    def states(self, u1: torch.Tensor, u2: torch.Tensor | None) -> None:
        if self.hidden is not None:
            self.hidden.append(u1)
        if self.relations is not None and u2 is not None:
            self.relations.append(u2)


def run_stack(atoms: Atoms, layers: Sequence[DualStreamLayer], input_ids: torch.Tensor,
              token_type_ids: torch.Tensor | None, domain: Domain, positions: torch.Tensor,
              rel_ids: torch.Tensor | None = None, *, relations: bool = True,
              contexts: Sequence[ContextHook] | None = None, checkpointing: bool = False,
              record: Record | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """ids (B, Q) at ``positions`` (B|1, Q) of ``domain`` -> final unary atoms (B, Q, D1)
    and binary atoms (B, Q, n, D2). ``rel_ids`` (B|1, Q, n) start the binary stream under RPE;
    ``contexts`` gives each causal layer its context hook; ``checkpointing`` recomputes each
    layer in the backward pass. With ``relations=False`` the last layer skips its binary-stream
    updates (nothing would read them) and the binary atoms come back None. ``record`` collects
    the per-layer states it asks for (`Record`). Checkpointed (and nothing recorded), the
    binary atoms are made inside the first layer's checkpoint, not kept through the step: a
    lookup in a small table, they cost less to make again than a square to hold (the same
    draws in the same order: the unary atoms' dropout, then theirs, then the layer's)."""
    cfg = atoms.cfg
    deferred = bool(checkpointing and record is None and layers and layers[0].training)
    if deferred:
        u1, u2 = atoms.unary(input_ids, token_type_ids, positions), None
    else:
        u1, u2 = atoms(input_ids, token_type_ids, positions, rel_ids, domain.n, domain.keep(),
                       redraw=checkpointing)
    last = len(layers) - 1
    for i, layer in enumerate(layers):
        if record is not None:
            record.states(u1, u2)
        kw = {"unary_only": not relations and i == last,
              "context": None if contexts is None else contexts[i]}
        if record is not None and record.attentions is not None:
            record.attentions.append({})
            kw["attentions"] = record.attentions[-1]
        if deferred and i == 0:  # (B, Q, n, D2) made, used and dropped inside the checkpoint
            u1, u2 = torch.utils.checkpoint.checkpoint(
                _from_atoms, atoms, layer, rel_ids, domain, u1, use_reentrant=False, **kw)
        elif checkpointing and layer.training:
            u1, u2 = torch.utils.checkpoint.checkpoint(layer, u1, u2, domain,
                                                       use_reentrant=False, **kw)
        else:
            u1, u2 = layer(u1, u2, domain, **kw)
    u1 = layer_norm(u1, cfg.D1, cfg.layer_norm_eps)
    if u2 is not None:  # LN(0) = 0: a causal stack's binary atoms stay masked
        u2 = layer_norm(u2, cfg.D2, cfg.layer_norm_eps)
    if record is not None:
        record.states(u1, u2)
    return u1, u2


def _from_atoms(atoms: Atoms, layer: DualStreamLayer, rel_ids: torch.Tensor | None,
                domain: Domain, u1: torch.Tensor, **kw) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The first layer on the binary atoms of ``u1``'s rows, made here (`run_stack`)."""
    u2 = atoms.binary(rel_ids, u1, domain.n, domain.keep(), redraw=True)
    return layer(u1, u2, domain, **kw)


class Stack(nn.Module):
    """An encoder's atoms, layers and pooler."""

    def __init__(self, cfg: ModelConfig, plan: ArchPlan, *, pooler: bool = True):
        super().__init__()
        self.cfg = cfg
        self.plan = plan
        self.atoms = Atoms(cfg)
        self.layers = make_layers(cfg, plan)
        self.pooler = nn.Linear(cfg.D1, cfg.D1) if pooler else None
        self.checkpointing = False

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None,
                domain: Domain, positions: torch.Tensor, rel_ids: torch.Tensor | None = None,
                *, relations: bool = True, record: Record | None = None
                ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """See `run_stack`."""
        return run_stack(self.atoms, self.layers, input_ids, token_type_ids, domain, positions,
                         rel_ids, relations=relations, checkpointing=self.checkpointing,
                         record=record)

    def pool(self, u1: torch.Tensor) -> torch.Tensor:
        """tanh(Linear) of token 0: (B, D1)."""
        return torch.tanh(self.pooler(u1[:, 0]))
