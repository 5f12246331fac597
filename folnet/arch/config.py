"""Model configuration: a frozen dataclass, size presets from folnet/specs/models/, validation."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from folnet import read_files
from folnet.errors import FolnetError, choices
from folnet.ops.compiler import parse_backend
from folnet.ops.spec import check_sizes, parse_spec

#: Position encodings: the paper's clipped relative distance starting the binary stream (rpe),
#: a BERT-style absolute table added to the unary atoms (ape), both (the released code's two
#: independent flags), static Shaw-style relative embeddings inside j and a (rpe*), or none.
POSITIONS = ("rpe", "ape", "ape+rpe", "rpe*", "none")
KINDS = ("encoder", "decoder", "encoder-decoder")
PRESETS = ("tiny", "small", "base", "large")


#: Upper bounds of the integer sizes, far above any trained FOLNet (base: D1 768, L 12,
#: vocab 32k) and below what a typo makes (D1 = 10**9): a size beyond its bound is refused
#: before anything is built. Sizes within the bounds can still add up to a model too large for
#: the machine; `folnet.arch.sizes` checks the implied parameter count before allocation.
SIZE_LIMITS = {
    "D1": 2**16, "D2": 2**16, "L": 1024, "H": 1024, "S": 2**16, "F1": 2**18, "F2": 2**18,
    "delta": 2**16, "vocab_size": 2**24, "type_vocab_size": 2**16, "max_positions": 2**20,
    "vocab_multiple": 2**16,
}
#: The upper bound of a head's output count (config.json's ``num_labels``): the vocabulary's,
#: since a text model's outputs are its vocabulary (`folnet.arch.vocab`).
NUM_LABELS_LIMIT = SIZE_LIMITS["vocab_size"]
#: The string fields and their closed sets of values (None: any non-empty string).
CHOICES: dict[str, tuple[str, ...] | None] = {
    "ops": None, "kind": KINDS, "position": POSITIONS, "backend": None,
}


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    """A real, finite number (JSON's int or float; not a bool, a string or NaN)."""
    return ((_is_int(value) or isinstance(value, float)) and value == value
            and abs(value) != float("inf"))


def check_fields(values: Mapping[str, Any], where: str = "") -> None:
    """Check the type and range of every model config field present in ``values``; a fault
    is a `FolnetError` starting with ``where`` and naming the field, its value and the limit.

    Run on every `ModelConfig` (``__post_init__``) and, before any conversion, on a config read
    from a file (`ModelConfig.from_dict`): a wrong type must fail here, not as a TypeError
    inside a layer at the first forward pass (``layer_norm_eps = "x"`` did)."""
    for name, limit in SIZE_LIMITS.items():
        if name in values:
            value = values[name]
            if not _is_int(value) or not 1 <= value <= limit:
                raise FolnetError(f"{where}{name} must be an integer in [1, {limit}], got "
                                  f"{value!r}")
    for name, allowed in CHOICES.items():
        if name in values:
            value = values[name]
            if not isinstance(value, str) or not value.strip():
                raise FolnetError(f"{where}{name} must be a non-empty string, got {value!r}")
            if allowed is not None and value not in allowed:
                raise FolnetError(f"{where}{name} {value!r} is unknown; use {choices(allowed)}")
    if "backend" in values:
        try:
            parse_backend(values["backend"])
        except FolnetError as exc:
            raise FolnetError(f"{where}{exc}") from None
    for name in ("dropout", "attention_dropout"):
        value = values.get(name)
        if name in values and not (value is None and name == "attention_dropout"):
            if not _is_number(value) or not 0.0 <= value < 1.0:
                raise FolnetError(f"{where}{name} must be a number in [0, 1), got {value!r}")
    if "layer_norm_eps" in values:
        value = values["layer_norm_eps"]
        if not _is_number(value) or not 0.0 < value <= 1.0:
            raise FolnetError(f"{where}layer_norm_eps must be a number in (0, 1], got "
                              f"{value!r}")
    if "initializer_range" in values:
        value = values["initializer_range"]
        if not _is_number(value) or not 0.0 <= value <= 1.0:
            raise FolnetError(f"{where}initializer_range must be a number in [0, 1], got "
                              f"{value!r}")
    if "operators" in values:
        operators = values["operators"]
        if not isinstance(operators, tuple) or not all(
                isinstance(t, tuple) and all(isinstance(kv, tuple) and len(kv) == 2
                                             and isinstance(kv[0], str) for kv in t)
                for t in operators):
            raise FolnetError(f"{where}operators must be a tuple of (field, value) tuples, got "
                              f"{operators!r}")


def check_num_labels(value: object, where: str = "num_labels") -> None:
    """Refuse a head output count that is not an integer in [1, `NUM_LABELS_LIMIT`] before it
    reaches torch, where ``2**63`` fails as "Overflow when unpacking long long" (and
    transformers would build a label map that large). ``where`` names the field."""
    if not _is_int(value) or not 1 <= value <= NUM_LABELS_LIMIT:
        raise FolnetError(f"{where} must be an integer in [1, {NUM_LABELS_LIMIT}], got "
                          f"{value!r}")


def check_operator_sizes(operators: tuple[tuple[tuple[str, Any], ...], ...],
                         dims: Mapping[str, int]) -> None:
    """Parse the spec of every operator a config carries and evaluate its size and scale
    expressions with the config's dimensions (`folnet.ops.spec.check_sizes`): the specs come
    from config.json, so a hostile expression must fail here, as a `FolnetError` naming
    ``operators[i]``, the operator, the field and the expression -- not hang or crash when
    the model is built."""
    for i, items in enumerate(operators):
        try:
            check_sizes(parse_spec(dict(items)), dims)
        except FolnetError as exc:
            raise FolnetError(f"operators[{i}]: {exc}") from None


def operator_items(specs: object, where: str) -> tuple[tuple[tuple[str, Any], ...], ...]:
    """The JSON form of ``operators`` (a list of spec tables) as the config holds it; the
    tables' contents are checked when the operators are registered (`parse_spec`)."""
    if not isinstance(specs, (list, tuple)):
        raise FolnetError(f"{where} must be a list of operator spec tables, got {specs!r}")
    for i, spec in enumerate(specs):
        if not isinstance(spec, Mapping) or not all(isinstance(k, str) for k in spec):
            raise FolnetError(f"{where}[{i}] must be an operator spec table (an object), got "
                              f"{spec!r}")
    return tuple(tuple(sorted(spec.items())) for spec in specs)


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
    # the word embedding's rows: the vocabulary rounded up to a multiple of this (8, as the
    # released models'; a resize makes it what was asked: `folnet.arch.vocab`)
    vocab_multiple: int = 8

    def __post_init__(self) -> None:
        check_fields({f.name: getattr(self, f.name) for f in dataclasses.fields(self)})
        check_operator_sizes(self.operators, self.dims)

    @property
    def padded_vocab(self) -> int:
        """Rows of the word embedding: the vocabulary rounded up to a multiple of
        ``vocab_multiple``."""
        return -(-self.vocab_size // self.vocab_multiple) * self.vocab_multiple

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
        if data["vocab_multiple"] == 8:  # the default: left out, as in files that predate it
            del data["vocab_multiple"]
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, source: str = "") -> ModelConfig:
        """A config from its JSON form (`to_dict`). Every field is checked for type and range
        before anything else reads it; ``source`` (e.g. ``"DIR/config.json: model."``) starts
        each error message, so a bad file names itself and the field."""
        if not isinstance(data, Mapping):
            raise FolnetError(f"{source.rstrip('.') or 'a model config'} must be an object of "
                              f"model config fields, got {type(data).__name__}")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise FolnetError(f"{source}unknown model config key(s) {unknown}; known: "
                              f"{sorted(known)}")
        data = dict(data)
        if "operators" in data:
            data["operators"] = operator_items(data["operators"], f"{source}operators")
        check_fields(data, source)
        try:  # the operators' expressions, which need the sizes (`check_operator_sizes`)
            return cls(**data)
        except FolnetError as exc:
            raise FolnetError(f"{source}{exc}") from None

OVERRIDES = ("D1", "D2", "L", "H", "S", "F1", "F2", "delta", "position", "vocab_size",
             "type_vocab_size", "dropout", "attention_dropout", "backend", "max_positions",
             "layer_norm_eps", "initializer_range")


def preset(name: str) -> dict[str, Any]:
    """Every overridable field of a size preset: `ModelConfig`'s defaults (FOLNet-Base, written
    only there) under what ``folnet/specs/models/NAME.toml`` changes."""
    path = read_files.specs_dir() / "models" / f"{name}.toml"
    if not path.is_file():
        available = sorted(p.stem for p in path.parent.glob("*.toml"))
        raise FolnetError(f"preset {name!r} is unknown; use {choices(available)}")
    data = read_files.load(path)
    unknown = sorted(set(data) - set(OVERRIDES))
    if unknown:
        raise FolnetError(f"{path}: unknown key(s) {unknown}; allowed: {list(OVERRIDES)}")
    defaults = ModelConfig()
    return {**{key: getattr(defaults, key) for key in OVERRIDES}, **data}


def make_config(ops: str, *, preset_name: str = "base", kind: str = "encoder",
                overrides: Mapping[str, Any] | None = None) -> ModelConfig:
    """Preset fields, then overrides, into a validated config."""
    overrides = dict(overrides or {})
    bad = sorted(set(overrides) - set(OVERRIDES))
    if bad:
        raise FolnetError(f"unknown override(s) {bad}; allowed: {list(OVERRIDES)}")
    fields = {**preset(preset_name), **overrides}
    return ModelConfig(ops=ops, kind=kind, **fields)
