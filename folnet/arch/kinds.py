"""The kinds of model -- encoder, decoder, encoder-decoder -- found by name.

Each model class registers itself under its kind (`register_kind`); `build_model`,
`folnet.from_pretrained` and every other place that must know "which kind of model" ask
`model_class`, so the answer lives here only.
"""

from __future__ import annotations

from collections.abc import Callable

from folnet.arch.config import KINDS
from folnet.errors import FolnetError, choices

_CLASSES: dict[str, type] = {}


def register_kind(kind: str) -> Callable[[type], type]:
    """Class decorator: the model class of ``kind`` (one of `KINDS`)."""
    if kind not in KINDS:
        raise FolnetError(f"kind {kind!r} is unknown; use {choices(KINDS)}")

    def register(cls: type) -> type:
        if kind in _CLASSES and _CLASSES[kind] is not cls:
            raise FolnetError(f"kind {kind!r} already has a model class "
                              f"({_CLASSES[kind].__name__})")
        cls.kind = kind
        _CLASSES[kind] = cls
        return cls

    return register


def model_class(kind: str) -> type:
    """The model class registered for ``kind``."""
    if kind not in _CLASSES:
        raise FolnetError(f"kind {kind!r} is unknown; use {choices(sorted(_CLASSES))}")
    return _CLASSES[kind]
