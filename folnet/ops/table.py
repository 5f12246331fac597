"""The registry as a table: the paper's Table 2 (and Table 5's mask column), from the data."""

from __future__ import annotations

from folnet.ops.registry import operators
from folnet.ops.spec import OperatorSpec

COLUMNS = ("Sym", "Name", "Typing", "B-dim", "R-dim", "Formula", "Kernel act.", "Mask")


def _row(spec: OperatorSpec) -> tuple[str, ...]:
    act = f"softmax_{spec.rdim}" if spec.activation == "softmax" else "identity"
    mask = ", ".join(spec.mask) if spec.mask else "-"
    return (spec.symbol, spec.name, str(spec.typing), spec.bdim, spec.rdim, spec.formula, act,
            mask)


def registry_table(specs: tuple[OperatorSpec, ...] | None = None, *, fmt: str = "text") -> str:
    """Render the operators as an aligned text table or a markdown table."""
    rows = [_row(s) for s in (operators() if specs is None else specs)]
    if fmt == "markdown":
        lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
        lines += ["| " + " | ".join(r) + " |" for r in rows]
        return "\n".join(lines)
    widths = [max(len(c), *(len(r[i]) for r in rows)) for i, c in enumerate(COLUMNS)]
    fmt_row = "  ".join(f"{{:<{w}}}" for w in widths)
    lines = [fmt_row.format(*COLUMNS), fmt_row.format(*("-" * w for w in widths))]
    lines += [fmt_row.format(*r) for r in rows]
    return "\n".join(line.rstrip() for line in lines)
