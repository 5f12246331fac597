"""Model configuration: a frozen dataclass, size presets from specs/models/, validation."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from folnet import files
from folnet.errors import FolnetError, choices
from folnet.ops.compiler import parse_backend

#: Position encodings: the paper's clipped relative distance starting the binary stream (rpe),
#: a BERT-style absolute table added to the unary atoms (ape), both (the released code's two
#: independent flags), static Shaw-style relative embeddings inside j and a (rpe*), or none.
POSITIONS = ("rpe", "ape", "ape+rpe", "rpe*", "none")
KINDS = ("encoder", "decoder", "encoder-decoder")
PRESETS = ("tiny", "small", "base", "large")


@dataclass(frozen=True)
class ModelConfig:
    """Everything needed to rebuild a FOLNet model (a checkpoint stores it as config.json).

    ``operators`` carries the spec tables of every non-built-in operator the architecture string
    uses, so a checkpoint loads without the code that registered them.
    """

    ops: str = "jmc.atp"
    kind: str = "encoder"
    D1: int = 768
    D2: int = 64
    L: int = 12
    H: int = 12
    S: int = 64
    F1: int = 3072
    F2: int = 256
    delta: int = 64
    position: str = "rpe"
    vocab_size: int = 32768
    type_vocab_size: int = 2
    max_positions: int = 512
    dropout: float = 0.1
    attention_dropout: float | None = None
    layer_norm_eps: float = 1e-12
    initializer_range: float = 0.02
    backend: str = "auto"
    operators: tuple[tuple[tuple[str, Any], ...], ...] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        for name in ("D1", "D2", "L", "H", "S", "F1", "F2", "delta", "vocab_size",
                     "type_vocab_size", "max_positions"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise FolnetError(f"{name} must be a positive integer, got {value!r}")
        if self.position not in POSITIONS:
            raise FolnetError(f"position {self.position!r} is unknown; use {choices(POSITIONS)}")
        if self.kind not in KINDS:
            raise FolnetError(f"kind {self.kind!r} is unknown; use {choices(KINDS)}")
        parse_backend(self.backend)
        for name in ("dropout", "attention_dropout"):
            value = getattr(self, name)
            if value is not None and not (0.0 <= float(value) < 1.0):
                raise FolnetError(f"{name} must be in [0, 1), got {value!r}")
        if not isinstance(self.ops, str):
            raise FolnetError(f"ops must be a string, got {type(self.ops).__name__}")

    @property
    def padded_vocab(self) -> int:
        """Rows of the word embedding: the vocabulary rounded up to a multiple of 8."""
        return -(-self.vocab_size // 8) * 8

    @property
    def absolute_positions(self) -> bool:
        """Whether the unary atoms get the absolute-position table."""
        return self.position in ("ape", "ape+rpe")

    @property
    def relative_atoms(self) -> bool:
        """Whether the binary stream starts from the relative-position embedding."""
        return self.position in ("rpe", "ape+rpe")

    @property
    def relative_ids(self) -> bool:
        """Whether the model reads clipped relative-distance ids (rpe, ape+rpe, rpe*)."""
        return self.position in ("rpe", "ape+rpe", "rpe*")

    @property
    def kernel_dropout(self) -> float:
        return self.dropout if self.attention_dropout is None else float(self.attention_dropout)

    @property
    def dims(self) -> dict[str, int]:
        """The names size expressions in operator specs may use."""
        return {"D1": self.D1, "D2": self.D2, "H": self.H, "S": self.S, "F1": self.F1,
                "F2": self.F2}

    def replace(self, **changes: Any) -> ModelConfig:
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["operators"] = [dict(t) for t in self.operators]
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ModelConfig:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise FolnetError(f"unknown model config key(s) {unknown}; known: {sorted(known)}")
        data = dict(data)
        if "operators" in data:
            data["operators"] = tuple(tuple(sorted(t.items())) for t in data["operators"])
        return cls(**data)


OVERRIDES = ("D1", "D2", "L", "H", "S", "F1", "F2", "delta", "position", "vocab_size",
             "type_vocab_size", "dropout", "attention_dropout", "backend", "max_positions",
             "layer_norm_eps", "initializer_range")


def preset(name: str) -> dict[str, Any]:
    """The fields of a size preset (``specs/models/NAME.toml``)."""
    path = files.specs_dir() / "models" / f"{name}.toml"
    if not path.is_file():
        available = sorted(p.stem for p in path.parent.glob("*.toml"))
        raise FolnetError(f"preset {name!r} is unknown; use {choices(available)}")
    data = files.load(path)
    unknown = sorted(set(data) - set(OVERRIDES))
    if unknown:
        raise FolnetError(f"{path}: unknown key(s) {unknown}; allowed: {list(OVERRIDES)}")
    return data


def make_config(ops: str, *, preset_name: str = "base", kind: str = "encoder",
                overrides: Mapping[str, Any] | None = None) -> ModelConfig:
    """Preset fields, then overrides, into a validated config."""
    overrides = dict(overrides or {})
    bad = sorted(set(overrides) - set(OVERRIDES))
    if bad:
        raise FolnetError(f"unknown override(s) {bad}; allowed: {list(OVERRIDES)}")
    fields = {**preset(preset_name), **overrides}
    return ModelConfig(ops=ops, kind=kind, **fields)
