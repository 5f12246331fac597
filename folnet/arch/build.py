"""Models from operator strings and from checkpoint directories.

The operator string is parsed once here (`folnet.arch.plan.parse_plan`) and the plan is
passed down to the stack and its layers; the kind of model is looked up in the one registry
(`folnet.arch.kinds`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from torch import nn

from folnet.arch import models  # noqa: F401  (registers the kinds of model)
from folnet.arch.checkpoint import ensure_operators, load_weights, read_metadata
from folnet.arch.config import ModelConfig, make_config
from folnet.arch.kinds import model_class
from folnet.arch.plan import ArchPlan, parse_plan
from folnet.errors import FolnetError
from folnet.ops.registry import is_builtin
from folnet.ops.spec import spec_to_dict


def build_model(ops: str = "jmc.atp", *, preset: str = "base", kind: str = "encoder",
                head: str | None = None, num_labels: int = 2, **overrides: Any) -> nn.Module:
    """Build a FOLNet.

    ``ops`` is an operator string (``"jmc.atp"``) or ``|``-separated per-layer strings;
    ``preset`` one of tiny, small, base, large (``specs/models/``); ``kind`` "encoder",
    "decoder" or "encoder-decoder"; ``overrides`` any of D1, D2, L, H, S, F1, F2, delta,
    position, vocab_size, type_vocab_size, dropout, backend. With ``head=None`` the bare
    encoder (the LM head for the text kinds); otherwise a name of `folnet.arch.heads.HEADS`.
    """
    cfg = make_config(ops, preset_name=preset, kind=kind, overrides=overrides)
    plan = parse_plan(cfg.ops, cfg.L)
    custom = tuple(tuple(sorted(spec_to_dict(s).items())) for s in plan.specs
                   if not is_builtin(s.symbol))
    if head is None and num_labels != 2 and kind == "encoder":
        raise FolnetError("num_labels only applies with a head")
    return model_from_config(cfg.replace(ops=str(plan), operators=custom), head=head,
                             num_labels=num_labels, plan=plan)


def model_from_config(cfg: ModelConfig, *, head: str | None = None, num_labels: int = 2,
                      plan: ArchPlan | None = None) -> nn.Module:
    """The model of ``cfg.kind`` for a config (its custom operators must be registered)."""
    return model_class(cfg.kind)(cfg, head, num_labels, plan=plan)


def from_pretrained(directory: str | Path, *, map_location: str = "cpu",
                    backend: str | None = None) -> nn.Module:
    """Rebuild a model saved with `save_pretrained` (weights loaded strictly). ``backend``
    overrides the operators' backend the checkpoint was saved with."""
    meta = read_metadata(directory)
    cfg = ModelConfig.from_dict(meta["model"])
    if backend is not None:
        cfg = cfg.replace(backend=backend)
    ensure_operators(cfg)
    model = model_from_config(cfg, head=meta.get("head"),
                              num_labels=int(meta.get("num_labels", 2)))
    load_weights(model, directory, map_location=map_location)
    return model.to(map_location)
