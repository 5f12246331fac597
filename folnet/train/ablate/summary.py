"""A row's seeds summarised, and which rows differ beyond their spread.

Each seed of a row (`folnet.train.ablate.run`) leaves a result: its metrics, and for tasks
with per-question labels which test questions it answered right (``answers``). A row's summary
gives every metric as a `Spread` (mean over seeds, seed std, 95% interval):

* accuracies over questions -- overall, on the trained chain lengths (``seen``), on the others
  (``unseen``) and per length k -- by the two-level bootstrap over seeds and questions of
  `folnet.train.ablate.stats`, recomputed from the answers;
* every other number (a metric without answers, the MLM loss, tokens per second) by the
  bootstrap over seeds alone.

`compare_rows` then says, for one metric, which pairs of rows differ: the 95% bootstrap
interval of their difference excludes zero. A [compare] plan's row (`summarise_cells`) holds
one such summary per cell -- arm (pretrained or scratch) and swept value -- which
`folnet.train.ablate.gain` pairs up.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from folnet.errors import FolnetError
from folnet.train.ablate.stats import (
    accuracy_spread,
    difference_interval,
    excludes_zero,
    seed_spread,
)

__all__ = ["Difference", "compare_rows", "hits_by_metric", "k_of", "per_k", "question_hits",
           "summarise_cells", "summarise_row"]

#: Per-seed numbers summarised besides the task metrics.
RUN_NUMBERS = ("tokens_per_s", "mlm_loss", "final_loss")
#: Row fields every seed shares (the architecture), copied into the summary.
SHARED = ("name", "ops", "position", "D2", "loss", "paper", "params", "flops_per_token",
          "pretrain_steps")


def per_k(name: str) -> bool:
    """Whether a metric is one chain length's accuracy (``accuracy_k7``)."""
    return "_k" in name and name.rsplit("_k", 1)[1].isdigit()


def k_of(name: str) -> int:
    """The chain length of a per-k metric (``accuracy_k7`` -> 7)."""
    return int(name.rsplit("_k", 1)[1])


def question_hits(answers: dict[str, Any]) -> dict[str, list[bool]]:
    """The right/wrong answers behind each accuracy metric of one seed: ``accuracy`` (every
    question) and, with chain lengths, ``accuracy_seen``, ``accuracy_unseen`` and
    ``accuracy_k<k>`` -- the same subsets `folnet.train.tasks.kinship.kinship_metrics` scores."""
    correct = [bool(c) for c in answers["correct"]]
    out = {"accuracy": correct}
    ks = answers.get("k")
    if ks is None:
        return out
    trained = set(answers.get("train_k", ()))
    groups = {"accuracy_seen": [k in trained for k in ks],
              "accuracy_unseen": [k not in trained for k in ks],
              **{f"accuracy_k{k}": [kk == k for kk in ks] for k in sorted(set(ks))}}
    for name, chosen in groups.items():
        if any(chosen):
            out[name] = [c for c, keep in zip(correct, chosen, strict=True) if keep]
    return out


def hits_by_metric(seeds: Sequence[dict[str, Any]], task: str) -> dict[str, list[list[bool]]]:
    """metric -> [seed][question] hits, for the metrics every seed has answers for."""
    per_seed = [question_hits(s["answers"][task]) for s in seeds
                if task in s.get("answers", {})]
    if len(per_seed) != len(seeds):
        return {}
    names = set(per_seed[0]).intersection(*per_seed[1:])
    return {name: [hits[name] for hits in per_seed] for name in sorted(names)}


def _mean_curve(curves: list[list[list[float]]]) -> list[list[float]]:
    """The mean of several (step, value) curves at the steps all of them logged."""
    if not curves or not all(curves):
        return []
    common = sorted(set.intersection(*({step for step, _ in c} for c in curves)))
    tables = [dict((step, value) for step, value in c) for c in curves]
    return [[step, float(np.mean([t[step] for t in tables]))] for step in common]


def summarise_row(seeds: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The summary of one row from its seeds' results (`folnet.train.ablate.run`)."""
    if not seeds:
        raise FolnetError("summarise_row: a row needs at least one finished seed")
    first = seeds[0]
    row: dict[str, Any] = {key: first.get(key) for key in SHARED}
    row["seeds"] = list(seeds)
    row["num_seeds"] = len(seeds)
    for key in RUN_NUMBERS:
        values = [s[key] for s in seeds if s.get(key) is not None]
        row[key] = seed_spread(values).to_dict() if len(values) == len(seeds) else None
    for key in ("pretrain_seconds", "finetune_seconds"):
        row[key] = float(sum(s.get(key) or 0.0 for s in seeds))
    row["loss_curve"] = _mean_curve([s.get("loss_curve") or [] for s in seeds])
    row["metrics"], row["baselines"], row["finetune_curves"] = {}, {}, {}
    for task in first.get("metrics", {}):
        hits = hits_by_metric(seeds, task)
        metrics: dict[str, Any] = {}
        for name in first["metrics"][task]:
            if name in hits:
                metrics[name] = accuracy_spread(hits[name], what=f"{row['name']} {name}")
            else:
                values = [s["metrics"][task].get(name) for s in seeds]
                if any(v is None for v in values):
                    continue
                metrics[name] = seed_spread(values)
            metrics[name] = metrics[name].to_dict()
        row["metrics"][task] = metrics
        row["baselines"][task] = first.get("baselines", {}).get(task, {})
        row["finetune_curves"][task] = _mean_curve(
            [s.get("finetune_curves", {}).get(task) or [] for s in seeds])
    return row


def summarise_cells(seeds: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The summary of one row of a [compare] plan from its seeds' results: the row's fields,
    and per cell (arm, swept value) a summary like `summarise_row`'s over the seeds, under
    ``cells`` in the seeds' cell order."""
    if not seeds:
        raise FolnetError("summarise_cells: a row needs at least one finished seed")
    fields = [key for key in SHARED if key != "pretrain_steps"]  # pretraining is per arm
    first = seeds[0]
    row: dict[str, Any] = {key: first.get(key) for key in fields}
    row["seeds"] = [{k: v for k, v in s.items() if k != "cells"} for s in seeds]
    row["num_seeds"] = len(seeds)
    row["cells"] = []
    for i, cell in enumerate(first["cells"]):
        per_seed = []
        for s in seeds:
            mine = s["cells"][i] if i < len(s["cells"]) else {}
            if (mine.get("arm"), mine.get("value")) != (cell["arm"], cell["value"]):
                raise FolnetError(f"{row['name']} seed {s.get('seed')}: cell {i + 1} is "
                                  f"not {cell['arm']} at {cell['value']!r} as in seed "
                                  f"{first.get('seed')}; the seeds ran different plans")
            per_seed.append({**{key: s.get(key) for key in fields}, "seed": s.get("seed"),
                             **mine})
        summary = summarise_row(per_seed)
        summary["arm"], summary["value"] = cell["arm"], cell["value"]
        row["cells"].append(summary)
    return row


@dataclass(frozen=True)
class Difference:
    """Row ``better`` minus row ``worse`` on ``metric``: the difference of the means and its
    95% bootstrap interval; ``real`` when the interval excludes zero."""

    metric: str
    better: str
    worse: str
    diff: float
    low: float
    high: float

    @property
    def real(self) -> bool:
        return excludes_zero(self.low, self.high)


def _row_hits(row: dict[str, Any], task: str, metric: str) -> list[list[bool]] | None:
    return hits_by_metric(row.get("seeds", []), task).get(metric)


def compare_rows(rows: Sequence[dict[str, Any]], task: str, metric: str) -> list[Difference]:
    """Every pair of rows on ``task``'s ``metric`` (an accuracy with per-question answers;
    other metrics are compared by their seed-level intervals), the higher mean first."""
    out = []
    for i, first in enumerate(rows):
        for second in rows[i + 1:]:
            a, b = first, second
            sa = a["metrics"].get(task, {}).get(metric)
            sb = b["metrics"].get(task, {}).get(metric)
            if sa is None or sb is None:
                continue
            if sa["mean"] < sb["mean"]:
                a, b, sa, sb = b, a, sb, sa
            ha, hb = _row_hits(a, task, metric), _row_hits(b, task, metric)
            if ha is not None and hb is not None:
                low, high = difference_interval(ha, hb)
            else:  # no per-question answers: the two seed-level intervals must not overlap
                low, high = sa["low"] - sb["high"], sa["high"] - sb["low"]
            out.append(Difference(metric, a["name"], b["name"], sa["mean"] - sb["mean"],
                                  low, high))
    return out
