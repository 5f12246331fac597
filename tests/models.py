"""The one seeded tiny model the tests build: `tiny_model`."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

import folnet


def tiny_model(ops: str = "jmc.atp", kind: str = "encoder", *, seed: int = 0,
               vocab_size: int = 100, dropout: float | None = 0.0, eval_mode: bool = False,
               relations: bool = False, **kw: Any) -> nn.Module:
    """``folnet.build_model(ops, preset="tiny", ...)`` after ``torch.manual_seed(seed)``:
    equal arguments give equal weights. ``dropout=None`` keeps the preset's; ``eval_mode``
    returns it in eval mode; ``relations`` asks for the final binary stream too."""
    torch.manual_seed(seed)
    if dropout is not None:
        kw["dropout"] = dropout
    model = folnet.build_model(ops, preset="tiny", kind=kind, vocab_size=vocab_size, **kw)
    if relations:
        model.relations = True
    return model.eval() if eval_mode else model
