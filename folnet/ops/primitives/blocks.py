"""What a block of rows receives from `folnet.ops.primitives.recompute.recompute_blocks`, by name:
the slabs it reads by rows (`Slab`), what every block reads whole (`Prologue`), and the one
`Block` each call of the caller's function gets. Kept apart from the recompute machinery,
which callers (`folnet.arch.layer.row_blocks`) drive through these types alone."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass

import torch

__all__ = ["Block", "Prologue", "Slab", "Tensors"]

Tensors = Mapping[Hashable, torch.Tensor]


@dataclass(frozen=True)
class Slab:
    """A tensor a block reads by rows: rows r0:r1 of ``inputs[source]`` along ``dim``. Read
    through the block's view of it, not by slicing the input, so that its gradient is
    slab-sized."""

    source: Hashable
    dim: int


@dataclass(frozen=True)
class Block:
    """What one block of rows r0:r1 receives.

    ``inputs`` every input whole (in the backward pass: detached leaves); ``slabs`` each
    `Slab`'s rows, by the slab's name; ``made`` the prologue's tensors over all rows, by name
    (empty without a prologue, and inside the prologue itself); ``sinks`` None in the forward
    pass, in the backward pass zeros like each made tensor, to which the block may add that
    tensor's gradient in place (`folnet.ops.primitives.sink`)."""

    r0: int
    r1: int
    inputs: Tensors
    slabs: Tensors
    made: Tensors
    sinks: Tensors | None


@dataclass(frozen=True)
class Prologue:
    """What every block reads whole, made span by span: ``make(block)`` returns rows r0:r1 of
    each such tensor by name, along its axis in ``dims`` (same names)."""

    make: Callable[[Block], Tensors]
    dims: Mapping[Hashable, int]
