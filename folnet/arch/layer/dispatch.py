"""What the dual-stream layer decides once per call and hands to its mixer, whole or in blocks:
which operators run, on which backend, with their kernels and premises in which layout.

Operands are named by ``(slot, role)`` (`Key`): the operator's slot in the layer and "kernel"
or "premise" -- never by their position in a list.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import torch
from torch import nn

from folnet.arch.config import ModelConfig
from folnet.arch.layer.domain import ContextHook, Domain
from folnet.arch.layer.slots import OperatorSlot, Segment
from folnet.ops.backends.base import CompiledOperator, Operand
from folnet.ops.compiler import Route
from folnet.ops.spec import ROLES

#: An operator's kernel or premise: (its slot in the layer, "kernel" or "premise").
Key = tuple[int, str]
#: The operands a mixer has made so far, by key.
Parts = dict[Key, Operand]
#: Per slot, the roles whose binary operand arrives masked already (a causal cache's).
Premasked = Mapping[int, frozenset[str]]


@dataclass(frozen=True)
class Dispatch:
    """The operators one call runs (``wanted``: slots, in order; a ``unary_only`` call skips
    the binary-output ones) and the route each takes (`folnet.ops.compiler.Route`: its
    backend, and how it wants each operand: "cl" (channels last), "cf" (channels first) or
    "fold" (the stream and its projection weight, never materialised))."""

    wanted: tuple[int, ...]
    routes: Mapping[int, Route]
    layouts: Mapping[Key, str]  # each wanted operand's layout, read from its route

    @classmethod
    def of(cls, wanted: tuple[int, ...], routes: Mapping[int, Route]) -> Dispatch:
        """The dispatch of ``routes``, their layouts keyed by operand (a plain field, not a
        cached property: torch.compile cannot enter the lock one takes)."""
        return cls(wanted, routes, {(i, role): routes[i].layouts[role] for i in wanted
                                    for role in ROLES})

    def keys(self) -> list[Key]:
        """Every wanted operator's kernel and premise."""
        return [(i, role) for i in self.wanted for role in ROLES]


class Mixer(Protocol):
    """What the mixer stage (`folnet.arch.layer.mixer`) and the blocked runner
    (`folnet.arch.layer.row_blocks`) use of the layer: its norms, projections, context hand-off,
    operators, output projections and binary FFN."""

    cfg: ModelConfig
    training: bool
    slots: list[OperatorSlot]
    segments: dict[Key, Segment]  # each operand's segment of its stream's projection
    ops: list[CompiledOperator]
    out_u: nn.Module | None
    ffn_b: nn.Module

    def norm_unary(self, u1: torch.Tensor) -> torch.Tensor: ...

    def project(self, n1: torch.Tensor | None, n2: torch.Tensor, dispatch: Dispatch,
                keys: Sequence[Key]) -> Parts: ...

    def letters(self, key: Key, layout: str) -> tuple[str, ...]: ...

    def reach(self, wanted: tuple[int, ...]) -> dict[str, list[Key]]: ...

    def folded(self, key: Key, n2: torch.Tensor) -> Operand: ...

    def norm_binary(self, u2: torch.Tensor) -> torch.Tensor: ...

    def take_context(self, parts: Parts, keep: torch.Tensor | None, hook: ContextHook
                     ) -> tuple[Parts, Premasked]: ...

    def operate(self, parts: Parts, dispatch: Dispatch, domain: Domain, premasked: Premasked,
                attentions: dict[str, torch.Tensor] | None = None
                ) -> dict[str, list[torch.Tensor]]: ...

    def updates(self, outs: dict[str, list[torch.Tensor]], domain: Domain
                ) -> tuple[torch.Tensor | None, torch.Tensor | None]: ...

    def parameters(self) -> Iterator[nn.Parameter]: ...
