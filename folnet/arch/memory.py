"""How a model's layers trade memory for recomputation on long sequences.

The binary stream is B x T x T x D2 per layer, and its stages' working sets are wider still.
Today one stage runs in blocks of query rows (`folnet.ops.kernels.blocked`): the binary
Boolean FFN, whose hidden layer (F2 = 4 D2 channels per pair) is the widest tensor of a layer.
The mode is a property of a run, not of the architecture -- it changes what is kept for the
backward pass, never the function computed -- so it is set on a built model (`set_memory`) and
not saved with it:

* ``"auto"`` (default): blocked from `AUTO_MIN_T` tokens on, the full square below (where the
  full square's fused CPU kernel is as fast and its memory small) and while tracing;
* ``"full"``: always the full square;
* ``"blocked"``: always blocked, ``block_rows`` rows at a time (default `DEFAULT_BLOCK_ROWS`).
"""

from __future__ import annotations

import torch
from torch import nn

from folnet.errors import FolnetError, choices

__all__ = ["AUTO_MIN_T", "DEFAULT_BLOCK_ROWS", "MEMORY_MODES", "block_rows_for", "set_memory"]

MEMORY_MODES = ("auto", "full", "blocked")
#: Sequence length from which ``"auto"`` blocks.
AUTO_MIN_T = 256
#: Query rows per block unless told otherwise.
DEFAULT_BLOCK_ROWS = 64


def block_rows_for(tokens: int, mode: str, block_rows: int | None) -> int | None:
    """Rows per block for a square of ``tokens`` tokens, or None for the full square. While
    torch.compile or torch.export traces, ``"auto"`` keeps the full square: a branch on the
    length would pin a dynamic length to one side of `AUTO_MIN_T`."""
    if mode == "full":
        return None
    if mode == "auto":
        traced = (torch.compiler.is_compiling() or torch.compiler.is_exporting()
                  or not isinstance(tokens, int))  # a symbolic length: tracing
        if traced or tokens < AUTO_MIN_T:
            return None
    return block_rows or DEFAULT_BLOCK_ROWS


def set_memory(model: nn.Module, mode: str = "auto", block_rows: int | None = None) -> nn.Module:
    """Set every dual-stream layer of ``model`` to ``mode`` (see the module docstring);
    returns the model."""
    if mode not in MEMORY_MODES:
        raise FolnetError(f"memory mode {mode!r} is unknown; use {choices(MEMORY_MODES)}")
    if block_rows is not None and (isinstance(block_rows, bool) or not isinstance(block_rows, int)
                                   or block_rows < 1):
        raise FolnetError(f"block_rows must be a positive integer (query rows per block), got "
                          f"{block_rows!r}")
    layers = [m for m in model.modules() if hasattr(m, "memory_mode")]
    if not layers:
        raise FolnetError(f"set_memory: {type(model).__name__} has no FOLNet layer")
    for layer in layers:
        layer.memory_mode, layer.block_rows = mode, block_rows
    return model
