"""Whether torch.compile or torch.export is tracing the current call: one test for the places
that must then behave differently (value checks, caches keyed by shapes, tensors cached across
calls), so that they cannot disagree about it."""

from __future__ import annotations

import torch

__all__ = ["traced"]


def traced() -> bool:
    """True while torch.compile or torch.export traces: value checks read data a trace does not
    have, and a cache keyed by a symbolic shape, or a tensor cached during one trace (a fake
    tensor), would leak into the next trace as a constant."""
    return torch.compiler.is_compiling() or torch.compiler.is_exporting()
