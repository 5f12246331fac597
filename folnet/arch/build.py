"""`build_model`: an operator string, a preset and overrides into a FOLNet model."""

from __future__ import annotations

from typing import Any

from folnet.arch.config import make_config
from folnet.arch.model import FolnetModel
from folnet.arch.plan import parse_plan
from folnet.errors import FolnetError
from folnet.ops.registry import is_builtin
from folnet.ops.spec import spec_to_dict


def build_model(ops: str = "jmc.atp", *, preset: str = "base", kind: str = "encoder",
                head: str | None = None, num_labels: int = 2, **overrides: Any) -> FolnetModel:
    """Build a FOLNet.

    ``ops`` is an operator string (``"jmc.atp"``) or ``|``-separated per-layer strings;
    ``preset`` one of tiny, small, base, large (``specs/models/``); ``overrides`` any of D1, D2,
    L, H, S, F1, F2, delta, position, vocab_size, type_vocab_size, dropout, backend. With
    ``head=None`` the bare encoder; otherwise one of ``folnet.arch.heads.HEADS``.
    """
    if kind != "encoder":
        from folnet.arch import text2text

        return text2text.build(ops, preset=preset, kind=kind, head=head, **overrides)
    cfg = make_config(ops, preset_name=preset, kind=kind, overrides=overrides)
    plan = parse_plan(cfg.ops, cfg.L)
    custom = tuple(tuple(sorted(spec_to_dict(s).items())) for s in plan.specs
                   if not is_builtin(s.symbol))
    cfg = cfg.replace(ops=str(plan), operators=custom)
    if head is None and num_labels != 2:
        raise FolnetError("num_labels only applies with a head")
    return FolnetModel(cfg, head=head, num_labels=num_labels)
