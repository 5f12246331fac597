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
from folnet.arch.checkpoint import (
    ensure_operators,
    load_weights,
    read_metadata,
    resolve_model_dir,
    saved_num_labels,
)
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


#: Config fields a loaded model may change: they alter training or speed, not the weights.
RUNTIME_FIELDS = ("dropout", "attention_dropout", "backend")


def from_pretrained(path: str | Path, *, head: str | None = None, num_labels: int | None = None,
                    map_location: str = "cpu", **runtime: Any) -> nn.Module:
    """A model from a directory saved by `save_pretrained` (weights loaded strictly).

    ``path`` is a model directory, or a run directory: its ``final/`` (pretraining), ``model/``
    (finetuning), else its latest checkpoint. ``head`` None keeps the saved head; another head
    name (or "none" for the bare encoder) puts that head, freshly initialised from torch's
    global generator, on the saved encoder (``num_labels`` outputs; seed first). ``runtime``
    overrides `RUNTIME_FIELDS` of the saved config (``dropout=0.0``, ``backend="einsum"``)."""
    directory = resolve_model_dir(path)
    meta = read_metadata(directory)
    cfg = ModelConfig.from_dict(meta["model"])
    bad = sorted(set(runtime) - set(RUNTIME_FIELDS))
    if bad:
        raise FolnetError(f"from_pretrained: {bad} cannot be changed on a saved model; "
                          f"allowed: {list(RUNTIME_FIELDS)}")
    cfg = cfg.replace(**runtime)
    ensure_operators(cfg)
    saved = meta.get("head")
    new_head = head is not None and (None if head == "none" else head) != saved
    if not new_head:
        model = model_from_config(cfg, head=saved, num_labels=(
            saved_num_labels(meta) if num_labels is None else num_labels))
        load_weights(model, directory, map_location=map_location)
        return model.to(map_location)
    if cfg.kind != "encoder":
        raise FolnetError(f"from_pretrained: a {cfg.kind!r} model keeps its 'lm' head; "
                          f"head={head!r} applies to encoders")
    model = model_from_config(cfg, head=None if head == "none" else head,
                              num_labels=2 if num_labels is None else num_labels)
    load_weights(model, directory, only="encoder.", map_location=map_location)
    return model.to(map_location)
