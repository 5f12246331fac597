"""A device's default random generator, saved and replayed.

Why: what a forward pass drew must be drawn again, identically, when its backward pass
recomputes it -- a block of rows (`folnet.ops.primitives.recompute`) or a dropout mask kept as
the generator state it came from rather than as one byte per element
(`folnet.ops.primitives.dropout`). Replaying leaves the generator where it was: the draws that
follow the backward pass are those of a run that never replayed.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

__all__ = ["replay", "rng_state"]


def rng_state(device: torch.device) -> torch.Tensor:
    """The state of ``device``'s default generator now (the CPU's for every non-CUDA device,
    as torch draws there)."""
    if device.type == "cuda":
        return torch.cuda.get_rng_state(device)
    return torch.get_rng_state()


@contextlib.contextmanager
def replay(device: torch.device, state: torch.Tensor) -> Iterator[None]:
    """Draw from ``state`` inside, and restore the generator's own state after."""
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        if device.type == "cuda":
            torch.cuda.set_rng_state(state, device)
        else:
            torch.set_rng_state(state)
        yield
