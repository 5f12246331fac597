"""Architecture strings -> frozen plans.

``"jmc.atp"`` lists the unary-output operators before the dot and the binary-output operators
after it; the Boolean FFN stage ``b`` always follows the mixer on both streams and is never
written. A per-layer plan is a sequence of such strings, one per layer (``["jmc.atp"] * 6 +
["j.a"] * 6``), or one string with ``|`` between layers. Letters resolve through the operator
registry, so registered operators work exactly like the built-ins. ``str(plan)`` gives the
string back.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from folnet.errors import FolnetError
from folnet.ops.registry import get_operator, operators
from folnet.ops.spec import OperatorSpec


@dataclass(frozen=True)
class LayerPlan:
    """The mixer operators of one layer: unary-output ones, then binary-output ones."""

    unary: tuple[OperatorSpec, ...]
    binary: tuple[OperatorSpec, ...]

    @property
    def ops(self) -> tuple[OperatorSpec, ...]:
        return self.unary + self.binary

    def __str__(self) -> str:
        return "".join(s.symbol for s in self.unary) + "." + "".join(s.symbol for s in self.binary)


@dataclass(frozen=True)
class ArchPlan:
    """One `LayerPlan` per layer."""

    layers: tuple[LayerPlan, ...]

    @property
    def uniform(self) -> bool:
        return len({str(layer) for layer in self.layers}) == 1

    @property
    def specs(self) -> tuple[OperatorSpec, ...]:
        """Every distinct operator the plan uses, in first-use order."""
        seen: dict[str, OperatorSpec] = {}
        for layer in self.layers:
            for spec in layer.ops:
                seen.setdefault(spec.symbol, spec)
        return tuple(seen.values())

    def __str__(self) -> str:
        if self.uniform:
            return str(self.layers[0])
        return "|".join(str(layer) for layer in self.layers)


def _known() -> str:
    return ", ".join(f"{s.symbol} ({s.name}, {s.typing})" for s in operators()
                     if s.realisation != "ffn")


def parse_layer(text: str) -> LayerPlan:
    """Parse one layer string such as ``"jmc.atp"``."""
    if not isinstance(text, str):
        raise FolnetError(f"operator string must be a str, got {type(text).__name__}")
    raw = text.strip()
    if not raw:
        raise FolnetError("operator string '' is empty; write unary-output operators, a dot, "
                          "then binary-output operators, e.g. 'jmc.atp'")
    if raw.count(".") != 1:
        what = "has no dot" if "." not in raw else "has more than one dot"
        raise FolnetError(f"operator string {text!r} {what}; write unary-output operators, one "
                          f"dot, then binary-output operators, e.g. 'jmc.atp' or 'j.a'")
    left, right = raw.split(".")
    if not left and not right:
        raise FolnetError(f"operator string {text!r} names no operator; e.g. 'j.a'")
    sides: dict[str, list[OperatorSpec]] = {"U": [], "B": []}
    seen: set[str] = set()
    for side, letters in (("U", left), ("B", right)):
        for letter in letters:
            if letter in seen:
                raise FolnetError(f"operator string {text!r} repeats {letter!r}; each operator "
                                  f"may appear once per layer")
            seen.add(letter)
            try:
                spec = get_operator(letter)
            except FolnetError:
                raise FolnetError(f"operator string {text!r}: unknown operator {letter!r}; "
                                  f"known: {_known()} (declare your own with --operators FILE, "
                                  f"a plan's [[operators]] or folnet.register_operator)"
                                  ) from None
            if spec.realisation == "ffn":
                raise FolnetError(f"operator string {text!r}: {letter!r} ({spec.name}) is the "
                                  f"FFN stage that follows every mixer; remove it from the string")
            if spec.typing.output != side:
                where, fix = ("before", "after") if side == "U" else ("after", "before")
                kind = "binary" if spec.typing.output == "B" else "unary"
                raise FolnetError(
                    f"operator string {text!r}: {letter!r} ({spec.name}, {spec.typing}) outputs "
                    f"{kind} atoms but stands {where} the dot; move it {fix} the dot")
            sides[side].append(spec)
    return LayerPlan(unary=tuple(sides["U"]), binary=tuple(sides["B"]))


def parse_plan(ops: str | Sequence[str] | ArchPlan, num_layers: int) -> ArchPlan:
    """A plan for ``num_layers`` layers from one string, a ``|``-separated string, or a list."""
    if isinstance(ops, ArchPlan):
        plan = ops
    else:
        if isinstance(ops, str):
            parts = ops.split("|") if "|" in ops else [ops] * num_layers
        elif isinstance(ops, Sequence):
            parts = list(ops)
        else:
            raise FolnetError(f"ops must be a string like 'jmc.atp' or a list of them, "
                              f"got {type(ops).__name__}")
        plan = ArchPlan(tuple(parse_layer(p) for p in parts))
    if len(plan.layers) != num_layers:
        raise FolnetError(f"ops {str(plan)!r} describes {len(plan.layers)} layers but L = "
                          f"{num_layers}; give one string per layer or a single string")
    return plan
