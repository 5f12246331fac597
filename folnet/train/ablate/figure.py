"""results.png: the systematic-generalisation figure of an ablation, next to its loss curves.

Left, for tasks scored per chain length (kinship): accuracy against k, one line per row with
its 95% band (bootstrap over seeds and questions), the trained lengths shaded and the majority
class dashed -- the paper's CLUTRR figure. Tasks without lengths get bars of their headline
metrics with the same intervals. Middle and right: the pretraining and finetuning loss curves,
mean over seeds.

A [compare] plan's results.png (`plot_sweep`) is the pretraining figure instead: per compared
metric, accuracy against the swept value (the label budget), one colour per row, the pretrained
arm solid and the scratch arm dashed, each with its 95% band (one value: the two arms side by
side per row, with their intervals as whiskers); the figure above, of the
pretrained rows at the last value, goes to results_by_k.png.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from folnet.atomic_write import atomic_write
from folnet.train.ablate.plan import Compare
from folnet.train.ablate.summary import k_of, per_k

__all__ = ["plot", "plot_sweep"]


#: How a row's pretraining loss reads in the loss panel's title.
_LOSS_NAMES = {"MLM.NSP": "MLM + NSP", "MLM.SOP": "MLM + SOP", "CLM": "next token",
               "PREFIX": "PrefixLM", "SPAN": "span corruption"}

def _per_k_metrics(rows: list[dict[str, Any]]) -> tuple[str, list[str]] | None:
    """(task, its per-k metric names by k) of the first task scored per chain length."""
    for row in rows:
        for task, metrics in row.get("metrics", {}).items():
            names = sorted((n for n in metrics if per_k(n)), key=k_of)
            if names:
                return task, names
    return None


def _trained_k(rows: list[dict[str, Any]], task: str) -> list[int]:
    for row in rows:
        for seed in row.get("seeds", []):
            answers = seed.get("answers", {}).get(task, {})
            if answers.get("train_k"):
                return list(answers["train_k"])
    return []


def _accuracy_by_k(ax: Any, rows: list[dict[str, Any]], task: str, names: list[str]) -> None:
    ks = [k_of(n) for n in names]
    trained = _trained_k(rows, task)
    for i, k in enumerate(trained):
        ax.axvspan(k - 0.5, k + 0.5, color="0.88", zorder=0,
                   label="trained lengths" if i == 0 else None)
    for row in rows:
        spreads = [row["metrics"].get(task, {}).get(n) for n in names]
        points = [(k, s) for k, s in zip(ks, spreads, strict=True) if s]
        if not points:
            continue
        xs = [k for k, _ in points]
        line, = ax.plot(xs, [s["mean"] for _, s in points], marker="o", markersize=3,
                        label=f"{row['name']} ({row.get('num_seeds', 1)} seeds)")
        ax.fill_between(xs, [s["low"] for _, s in points], [s["high"] for _, s in points],
                        color=line.get_color(), alpha=0.18, linewidth=0)
    majority = [rows[0].get("baselines", {}).get(task, {}).get(
        n.replace("accuracy", "majority_baseline")) for n in names]
    if all(m is not None for m in majority):
        ax.plot(ks, majority, color="black", linestyle="--", linewidth=1, label="majority class")
    ax.set_xticks(ks)
    ax.set_xlim(min(ks) - 0.5, max(ks) + 0.5)
    ax.set_ylim(0.0, 1.02)
    ax.set_xlabel("chain length k (facts to compose)")
    ax.set_ylabel(f"{task} test accuracy")
    ax.set_title("systematic generalisation: mean and 95% band")
    ax.legend(fontsize=7, loc="upper right")


def _bars(ax: Any, rows: list[dict[str, Any]]) -> None:
    columns = [(t, n) for r in rows for t, ms in r.get("metrics", {}).items() for n in ms
               if not per_k(n)]
    columns = list(dict.fromkeys(columns))
    width = 0.8 / max(1, len(columns))
    for j, (task, name) in enumerate(columns):
        xs, means, errors = [], [], [[], []]
        for i, row in enumerate(rows):
            s = row.get("metrics", {}).get(task, {}).get(name)
            if s:
                xs.append(i + j * width)
                means.append(s["mean"])
                errors[0].append(s["mean"] - s["low"])
                errors[1].append(s["high"] - s["mean"])
        ax.bar(xs, means, width=width, yerr=errors, capsize=2, label=f"{task} {name}")
    ax.set_xticks([i + width * (len(columns) - 1) / 2 for i in range(len(rows))])
    ax.set_xticklabels([r["name"] for r in rows], rotation=30, ha="right", fontsize=8)
    ax.set_title("metrics per row: mean and 95% interval")
    ax.legend(fontsize=7)


def _curves(ax: Any, rows: list[dict[str, Any]], pick: Any, xlabel: str, title: str) -> None:
    drawn = False
    for row in rows:
        curve = pick(row) or []
        if curve:
            ax.plot([p[0] for p in curve], [p[1] for p in curve], label=row["name"])
            drawn = True
    ax.set_xlabel(xlabel)
    ax.set_ylabel("loss (mean over seeds)")
    ax.set_title(title)
    if drawn:
        ax.legend(fontsize=7)


def plot(rows: list[dict[str, Any]], path: Path, *, title: str) -> Path | None:
    """Write the figure to ``path`` (atomically); None without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:  # pragma: no cover - matplotlib is in the train extra
        return None
    fig, axes = plt.subplots(1, 3, figsize=(17, 5), gridspec_kw={"width_ratios": [1.4, 1, 1]})
    found = _per_k_metrics(rows)
    if found is not None:
        _accuracy_by_k(axes[0], rows, *found)
    else:
        _bars(axes[0], rows)
    losses = ", ".join(dict.fromkeys(_LOSS_NAMES.get(r.get("loss"), str(r.get("loss")))
                                     for r in rows))
    _curves(axes[1], rows, lambda r: r.get("loss_curve"), "pretraining step",
            f"pretraining loss ({losses})")
    task = found[0] if found else next(iter(rows[0].get("metrics", {})), None)
    _curves(axes[2], rows, lambda r: r.get("finetune_curves", {}).get(task),
            "finetuning step", f"finetuning loss ({task})")
    fig.suptitle(title)
    fig.tight_layout()
    atomic_write(path, lambda p: fig.savefig(p, dpi=100, format="png"))
    plt.close(fig)
    return path


def _cell_spread(row: dict[str, Any], arm: str, value: Any, task: str, metric: str
                 ) -> dict[str, float] | None:
    """The mean and interval of one (arm, value) cell of a row, or None when it has none."""
    cell = next((c for c in row.get("cells", ()) if c.get("arm") == arm
                 and c.get("value") == value), None)
    return (cell or {}).get("metrics", {}).get(task, {}).get(metric)


def _single_panel(ax: Any, rows: list[dict[str, Any]], compare: Compare, task: str,
                  metric: str) -> None:
    """One value swept: per row, the two arms side by side with their 95% intervals as
    whiskers (a band needs two values to be drawn)."""
    value = compare.values[0]
    for i, row in enumerate(rows):
        for arm, shift, marker in (("pretrained", -0.12, "o"), ("scratch", 0.12, "s")):
            spread = _cell_spread(row, arm, value, task, metric)
            if not spread:
                continue
            mean = spread["mean"]
            ax.errorbar([i + shift], [mean], yerr=[[mean - spread["low"]], [spread["high"] - mean]],
                        fmt=marker, color=f"C{i % 10}", capsize=4, markersize=6,
                        mfc="white" if arm == "scratch" else None, label=f"{row['name']} {arm}")
    ax.set_xticks(range(len(rows)))
    ax.set_xticklabels([row["name"] for row in rows])
    ax.set_xlim(-0.6, len(rows) - 0.4)
    ax.set_ylim(0.0, 1.02)
    ax.set_ylabel(f"{task} {metric}")
    where = f" at {compare.option} = {value}" if compare.option else ""
    ax.set_title(f"{metric}{where}\npretrained (filled) vs scratch (open), 95% intervals",
                 fontsize=10)
    ax.legend(fontsize=7)


def _sweep_panel(ax: Any, rows: list[dict[str, Any]], compare: Compare, task: str,
                 metric: str) -> None:
    if len(compare.values) == 1:
        _single_panel(ax, rows, compare, task, metric)
        return
    numeric = all(isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0
                  for v in compare.values)
    xs = list(compare.values) if numeric else list(range(len(compare.values)))
    colours = [f"C{i % 10}" for i in range(len(rows))]
    for row, colour in zip(rows, colours, strict=True):
        for arm, style in (("pretrained", "-"), ("scratch", "--")):
            points = []
            for x, value in zip(xs, compare.values, strict=True):
                spread = _cell_spread(row, arm, value, task, metric)
                if spread:
                    points.append((x, spread))
            if not points:
                continue
            px = [x for x, _ in points]
            ax.plot(px, [s["mean"] for _, s in points], style, color=colour,
                    marker="o" if arm == "pretrained" else "s", markersize=4,
                    label=f"{row['name']} {arm}")
            ax.fill_between(px, [s["low"] for _, s in points], [s["high"] for _, s in points],
                            color=colour, alpha=0.12 if arm == "pretrained" else 0.06,
                            linewidth=0)
    if numeric and max(xs) / min(xs) >= 10:
        ax.set_xscale("log")
    ax.set_xticks(xs)
    ax.set_xticklabels([str(v) for v in compare.values])
    ax.set_ylim(0.0, 1.02)
    ax.set_xlabel(compare.option or "setting")
    ax.set_ylabel(f"{task} {metric}")
    ax.set_title(f"{metric}: pretrained (solid) vs scratch (dashed), 95% bands")
    ax.legend(fontsize=7)


def plot_sweep(rows: list[dict[str, Any]], compare: Compare, metrics: list[tuple[str, str]],
               path: Path, *, title: str) -> Path | None:
    """Write the pretraining figure of a [compare] plan (one panel per (task, metric) of
    ``metrics``, at most three) to ``path``; None without matplotlib or metrics."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:  # pragma: no cover - matplotlib is in the train extra
        return None
    metrics = metrics[:3]
    if not metrics:
        return None
    fig, axes = plt.subplots(1, len(metrics), figsize=(6.5 * len(metrics), 5), squeeze=False)
    for ax, (task, metric) in zip(axes[0], metrics, strict=True):
        _sweep_panel(ax, rows, compare, task, metric)
    fig.suptitle(title)
    fig.tight_layout()
    atomic_write(path, lambda p: fig.savefig(p, dpi=100, format="png"))
    plt.close(fig)
    return path
