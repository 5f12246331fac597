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
from folnet.arch.config import NUM_LABELS_LIMIT, ModelConfig, check_num_labels, make_config
from folnet.arch.io.model_dir import (
    ensure_operators,
    load_weights,
    read_metadata,
    resolve_model_dir,
    saved_num_labels,
)
from folnet.arch.kinds import model_class
from folnet.arch.plan import ArchPlan, parse_plan
from folnet.arch.sizes import (
    check_memory,
    check_shapes,
    describe_sizes,
    implied_shapes,
    meta_model,
    weight_shapes,
)
from folnet.errors import FolnetError
from folnet.ops.registry import is_builtin
from folnet.ops.spec import spec_to_dict


def build_model(ops: str = "jmc.atp", *, preset: str = "base", kind: str = "encoder",
                head: str | None = None, num_labels: int = 2, **overrides: Any) -> nn.Module:
    """Build a FOLNet.

    ``ops`` is an operator string (``"jmc.atp"``) or ``|``-separated per-layer strings;
    ``preset`` one of tiny, small, base, large (``folnet/specs/models/``); ``kind`` "encoder",
    "decoder" or "encoder-decoder"; ``overrides`` any of D1, D2, L, H, S, F1, F2, delta,
    position, vocab_size, type_vocab_size, dropout, backend. With ``head=None`` the bare
    encoder (the LM head for the text kinds); otherwise a name of `folnet.arch.heads.HEADS`.
    Sizes whose parameters would not fit in memory are refused before anything is allocated
    (`folnet.arch.sizes`).
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
    """The model of ``cfg.kind`` for a config (its custom operators must be registered).

    The model is first built on the meta device (shapes only) and its implied size checked
    against the memory it would take (`folnet.arch.sizes.check_memory`), so absurd sizes are a
    `FolnetError` naming them instead of an allocation failure."""
    check_memory(meta_model(lambda: _construct(cfg, head, num_labels, plan)), cfg,
                 f"{'an' if cfg.kind[0] in 'aeiou' else 'a'} {cfg.kind} model")
    return _construct(cfg, head, num_labels, plan)


def _construct(cfg: ModelConfig, head: str | None, num_labels: int,
               plan: ArchPlan | None) -> nn.Module:
    """The model, built where the caller's device context says. Every construction passes
    here, so an output count torch could not take (``num_labels=2**63``) is refused here; the
    model checks the rest (a type, a count below 1) where the head needs one."""
    if isinstance(num_labels, int) and num_labels > NUM_LABELS_LIMIT:
        check_num_labels(num_labels)
    return model_class(cfg.kind)(cfg, head, num_labels, plan=plan)


#: Config fields a loaded model may change: they alter training or speed, not the weights.
RUNTIME_FIELDS = ("dropout", "attention_dropout", "backend")


def read_config(directory: Path, meta: dict[str, Any]) -> ModelConfig:
    """The model config of a checkpoint's config.json, every field checked, its custom
    operators registered and its operator string parsed: each fault a `FolnetError` naming
    the file and the field."""
    where = directory / "config.json"
    cfg = ModelConfig.from_dict(meta["model"], source=f"{where}: model.")
    try:
        ensure_operators(cfg)
        parse_plan(cfg.ops, cfg.L)
    except FolnetError as exc:
        raise FolnetError(f"{where}: model.ops / model.operators: {exc}") from None
    return cfg


def from_pretrained(path: str | Path, *, head: str | None = None, num_labels: int | None = None,
                    map_location: str = "cpu", **runtime: Any) -> nn.Module:
    """A model from a directory saved by `save_pretrained` (weights loaded strictly).

    ``path`` is a model directory, or a run directory: its ``final/`` (pretraining), ``model/``
    (finetuning), else its latest checkpoint. ``head`` None keeps the saved head; another head
    name (or "none" for the bare encoder) puts that head, freshly initialised from torch's
    global generator, on the saved encoder (``num_labels`` outputs; seed first). ``runtime``
    overrides `RUNTIME_FIELDS` of the saved config (``dropout=0.0``, ``backend="einsum"``).

    Nothing is allocated before the config is known to fit its weights: every field of
    config.json is checked, the model is built on the meta device and its tensor shapes are
    compared with the weights file's header (`folnet.arch.sizes`)."""
    directory = resolve_model_dir(path)
    meta = read_metadata(directory)
    cfg = read_config(directory, meta)
    bad = sorted(set(runtime) - set(RUNTIME_FIELDS))
    if bad:
        raise FolnetError(f"from_pretrained: {bad} cannot be changed on a saved model; "
                          f"allowed: {list(RUNTIME_FIELDS)}")
    cfg = cfg.replace(**runtime)
    saved = meta.get("head")
    new_head = head is not None and (None if head == "none" else head) != saved
    if new_head and cfg.kind != "encoder":
        raise FolnetError(f"from_pretrained: a {cfg.kind!r} model keeps its 'lm' head; "
                          f"head={head!r} applies to encoders")
    if new_head:
        head, only = None if head == "none" else head, "encoder."
        labels = 2 if num_labels is None else num_labels
    else:
        head, only = saved, None
        labels = saved_num_labels(meta) if num_labels is None else num_labels
    where = directory / "config.json"
    try:  # shapes only: a config that cannot be built fails here, naming its file
        shell = meta_model(lambda: _construct(cfg, head, labels, None))
    except FolnetError as exc:
        raise FolnetError(f"{where} (head {head!r}, num_labels {labels!r}): {exc}") from None
    weights = directory / "model.safetensors"
    check_shapes(implied_shapes(shell), weight_shapes(weights), str(weights), only=only,
                 config=f"{where} ({describe_sizes(cfg)})")
    check_memory(shell, cfg, str(where))
    model = _construct(cfg, head, labels, None)
    load_weights(model, directory, only=only, map_location=map_location)
    return model.to(map_location)
