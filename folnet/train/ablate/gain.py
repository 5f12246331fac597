"""What pretraining adds: per row, swept value and metric, the pretrained arm minus the scratch
arm, with a 95% interval paired by seed and question.

A [compare] row (`folnet.train.ablate.summary.summarise_cells`) has one summary per cell (arm,
value). Both arms of a seed start from the same initial weights, corpus and tokenizer, and
finetune with the same seed on the same questions, so their difference is taken seed by seed
and question by question (`folnet.train.ablate.stats.paired_difference_interval`); the pairing
is checked -- the same seeds, and per seed the same number of questions with the same chain
lengths in the same order -- and a mismatch is an error, not a silently unpaired interval.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from folnet.errors import FolnetError
from folnet.train.ablate.stats import excludes_zero, paired_difference_interval
from folnet.train.ablate.summary import hits_by_metric

__all__ = ["Gain", "cell_of", "gain_table", "gain_text", "gains"]


@dataclass(frozen=True)
class Gain:
    """Row ``row`` at swept ``value``: pretrained minus scratch on ``task``'s ``metric`` (the
    difference of the means over seeds) and its paired 95% interval; ``real`` when the interval
    excludes zero."""

    row: str
    value: Any
    task: str
    metric: str
    pretrained: float
    scratch: float
    diff: float
    low: float
    high: float
    seeds: int

    @property
    def real(self) -> bool:
        return excludes_zero(self.low, self.high)

    def to_dict(self) -> dict[str, Any]:
        return {"row": self.row, "value": self.value, "task": self.task, "metric": self.metric,
                "pretrained": self.pretrained, "scratch": self.scratch, "gain": self.diff,
                "low": self.low, "high": self.high, "seeds": self.seeds, "real": self.real}


def cell_of(row: dict[str, Any], arm: str, value: Any) -> dict[str, Any] | None:
    """The summary of one cell of a [compare] row, or None."""
    for cell in row.get("cells", ()):
        if cell.get("arm") == arm and cell.get("value") == value:
            return cell
    return None


def _paired_hits(pre: dict[str, Any], scratch: dict[str, Any], task: str,
                 metric: str) -> tuple[list[list[bool]], list[list[bool]]] | None:
    """Both arms' answers behind ``metric``, seed for seed, once checked to be paired."""
    seeds_a = [s.get("seed") for s in pre.get("seeds", ())]
    seeds_b = [s.get("seed") for s in scratch.get("seeds", ())]
    if seeds_a != seeds_b:
        raise FolnetError(f"{pre.get('name')}: the arms ran seeds {seeds_a} and {seeds_b}; "
                          f"a paired gain needs the same")
    for a, b in zip(pre["seeds"], scratch["seeds"], strict=True):
        ka = a.get("answers", {}).get(task, {}).get("k")
        kb = b.get("answers", {}).get(task, {}).get("k")
        if ka != kb:
            raise FolnetError(f"{pre.get('name')} seed {a.get('seed')}: the arms answered "
                              f"different questions on {task}; a paired gain needs the same")
    hits_a = hits_by_metric(pre["seeds"], task).get(metric)
    hits_b = hits_by_metric(scratch["seeds"], task).get(metric)
    if hits_a is None or hits_b is None:
        return None
    return hits_a, hits_b


def gains(rows: Sequence[dict[str, Any]], values: Sequence[Any], task: str,
          metric: str) -> list[Gain]:
    """The gain of every row at every value on ``task``'s ``metric`` (an accuracy with
    per-question answers; other metrics have no paired interval and are left out)."""
    out = []
    for row in rows:
        for value in values:
            pre, scratch = cell_of(row, "pretrained", value), cell_of(row, "scratch", value)
            if pre is None or scratch is None:
                continue
            sa = pre.get("metrics", {}).get(task, {}).get(metric)
            sb = scratch.get("metrics", {}).get(task, {}).get(metric)
            hits = _paired_hits(pre, scratch, task, metric)
            if sa is None or sb is None or hits is None:
                continue
            low, high = paired_difference_interval(*hits)
            out.append(Gain(row["name"], value, task, metric, sa["mean"], sb["mean"],
                            sa["mean"] - sb["mean"], low, high, len(hits[0])))
    return out


def _interval(g: Gain) -> str:
    return f"{g.diff:+.3f} [{g.low:+.3f}, {g.high:+.3f}]"


def gain_table(found: Sequence[Gain], option: str | None) -> str:
    """A markdown table: one line per row and value, per metric the two arms' means and the
    gain with its interval (a * marks an interval that excludes 0)."""
    metrics = list(dict.fromkeys((g.task, g.metric) for g in found))
    lines_at = list(dict.fromkeys((g.row, repr(g.value)) for g in found))
    by = {(g.row, repr(g.value), g.task, g.metric): g for g in found}
    head = ["Row", option or "setting", "Seeds"]
    for task, metric in metrics:
        head += [f"{task} {metric}: pretrained", "scratch", "gain [95% interval]"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row, value in lines_at:
        cells: list[str] = []
        seeds = "-"
        for task, metric in metrics:
            g = by.get((row, value, task, metric))
            if g is None:
                cells += ["-", "-", "-"]
                continue
            seeds = str(g.seeds)
            cells += [f"{g.pretrained:.3f}", f"{g.scratch:.3f}",
                      _interval(g) + (" *" if g.real else "")]
        shown = "-" if value == "None" else value
        lines.append(f"| {row} | {shown} | {seeds} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def gain_text(found: Sequence[Gain], option: str | None) -> str:
    """Per metric, each row's gain in words: above zero beyond the spread, below it, or
    within it (not a finding); and which row gains most."""
    lines: list[str] = []
    for task, metric in dict.fromkeys((g.task, g.metric) for g in found):
        mine = [g for g in found if (g.task, g.metric) == (task, metric)]
        lines.append(f"**Pretraining gain on {task} {metric}**:")
        for g in mine:
            at = f" at {option} = {g.value}" if option is not None else ""
            if g.low > 0.0:
                verdict = "pretraining helps beyond the spread (the interval excludes 0)"
            elif g.high < 0.0:
                verdict = "pretraining hurts beyond the spread (the interval excludes 0)"
            else:
                verdict = "within the spread (the interval holds 0), so not a finding"
            lines.append(f"- {g.row}{at}: {_interval(g)}: {verdict}.")
        best = max(mine, key=lambda g: g.diff)
        at = f" (at {option} = {best.value})" if option is not None else ""
        lines.append(f"- largest gain: {best.row}{at}, {_interval(best)}"
                     f"{'' if best.real else ', its interval holding 0'}.")
        lines.append("")
    return "\n".join(lines).rstrip()
