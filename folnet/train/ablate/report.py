"""Turn finished ablation rows into results.md, results.csv, results.json and a PNG plot."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Any

from folnet.io import atomic_write, atomic_write_json, atomic_write_text


def _fmt(value: Any, spec: str = "") -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return format(value, spec or ".3f")
    return str(value)


def _per_k(name: str) -> bool:
    return "_k" in name and name.rsplit("_k", 1)[1].isdigit()


def metric_columns(rows: list[dict[str, Any]], *, per_k: bool = False) -> list[tuple[str, str]]:
    """(task, metric) pairs in first-seen order: the headline metrics, or (``per_k``) the
    per-chain-length ones of the kinship task."""
    seen: list[tuple[str, str]] = []
    for row in rows:
        for task, metrics in row.get("metrics", {}).items():
            for name in metrics:
                if _per_k(name) == per_k and (task, name) not in seen:
                    seen.append((task, name))
    if per_k:
        seen.sort(key=lambda tn: (tn[0], int(tn[1].rsplit("_k", 1)[1])))
    return seen


def markdown_table(rows: list[dict[str, Any]], *, title: str = "") -> str:
    """The Table 3-like table, then (for the kinship task) accuracy per chain length."""
    metrics = metric_columns(rows)
    papers = sorted({k for r in rows for k in r.get("paper", {})})
    head = ["#", "Model", "Params", "PE", "D2", "Loss", "FLOPs/token", "tokens/s", "MLM loss"]
    head += [f"{task} {name}" for task, name in metrics]
    head += [f"paper {k}" for k in papers]
    lines = []
    if title:
        lines += [f"### {title}", ""]
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for i, r in enumerate(rows, 1):
        cells = [str(i), f"FOLNet: {r['ops']}", f"{r['params'] / 1e6:.2f}M",
                 r["position"].upper(), str(r["D2"]), r["loss"],
                 f"{r['flops_per_token'] / 1e6:.1f}M", _fmt(r.get("tokens_per_s"), ".0f"),
                 _fmt(r.get("mlm_loss"))]
        cells += [_fmt(r.get("metrics", {}).get(t, {}).get(n)) for t, n in metrics]
        cells += [_fmt(r.get("paper", {}).get(k)) for k in papers]
        lines.append("| " + " | ".join(cells) + " |")
    baselines = {(t, n): v for r in rows for t, b in r.get("baselines", {}).items()
                 for n, v in b.items()}
    if baselines:
        lines += ["", "Baselines: " + ", ".join(f"{t} {n} {v:.3f}" for (t, n), v in
                                                 sorted(baselines.items()) if not _per_k(n))]
    per_k = metric_columns(rows, per_k=True)
    if per_k:
        ks = [n.rsplit("_k", 1)[1] for _, n in per_k]
        lines += ["", "Accuracy per chain length k (trained on the seen lengths):", "",
                  "| # | Model | " + " | ".join(f"k={k}" for k in ks) + " |",
                  "|" + "---|" * (len(ks) + 2)]
        for i, r in enumerate(rows, 1):
            cells = [_fmt(r.get("metrics", {}).get(t, {}).get(n)) for t, n in per_k]
            lines.append(f"| {i} | {r['name']} | " + " | ".join(cells) + " |")
        majority = [baselines.get((t, n.replace("accuracy", "majority_baseline")))
                    for t, n in per_k]
        if any(m is not None for m in majority):
            lines.append("| - | majority class | " + " | ".join(_fmt(m) for m in majority) + " |")
    return "\n".join(lines) + "\n"


def csv_text(rows: list[dict[str, Any]]) -> str:
    metrics = metric_columns(rows)
    fields = ["name", "ops", "position", "D2", "loss", "params", "flops_per_token",
              "tokens_per_s", "mlm_loss", "pretrain_seconds", "finetune_seconds"]
    buf = io.StringIO()
    writer = csv.writer(buf)
    metrics = metrics + metric_columns(rows, per_k=True)
    writer.writerow(fields + [f"{t}/{n}" for t, n in metrics])
    for r in rows:
        writer.writerow([r.get(f) for f in fields]
                        + [r.get("metrics", {}).get(t, {}).get(n) for t, n in metrics])
    return buf.getvalue()


def plot(rows: list[dict[str, Any]], path: Path, *, title: str) -> Path | None:
    """Bars of every headline metric per row, and the pretraining loss curves."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:  # pragma: no cover - matplotlib is in the train extra
        return None
    metrics = metric_columns(rows)
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.8))
    names = [r["name"] for r in rows]
    ax = axes[0]
    width = 0.8 / max(1, len(metrics))
    baselines = {(t, n.replace("majority_baseline", "accuracy")): v for r in rows
                 for t, b in r.get("baselines", {}).items()
                 for n, v in b.items() if not _per_k(n)}
    labelled = False
    for j, (task, name) in enumerate(metrics):
        values = [r.get("metrics", {}).get(task, {}).get(name) or 0.0 for r in rows]
        xs = [i + j * width for i in range(len(rows))]
        ax.bar(xs, values, width=width, label=f"{task} {name}")
        if (task, name) in baselines:
            # the majority class on the same questions, as a dashed cap over each bar
            ax.hlines([baselines[task, name]] * len(xs), [x - width / 2 for x in xs],
                      [x + width / 2 for x in xs], colors="black", linestyles="--",
                      linewidth=1, label=None if labelled else "majority class")
            labelled = True
    ax.set_xticks([i + width * (len(metrics) - 1) / 2 for i in range(len(rows))])
    ax.set_xticklabels(names, rotation=30, ha="right", fontsize=8)
    ax.set_title("downstream metrics per row")
    ax.legend(fontsize=8)
    ax = axes[1]
    for r in rows:
        curve = r.get("loss_curve") or []
        if curve:
            ax.plot([p[0] for p in curve], [p[1] for p in curve], label=r["name"])
    ax.set_xlabel("pretraining step")
    ax.set_ylabel("MLM + NSP/SOP loss")
    ax.set_title("pretraining loss")
    ax.legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    atomic_write(path, lambda p: fig.savefig(p, dpi=110, format="png"))
    plt.close(fig)
    return path


def write_reports(rows: list[dict[str, Any]], out: Path, *, plan_name: str,
                  header: str = "") -> dict[str, Path]:
    """Write every report file into ``out``; returns their paths."""
    out.mkdir(parents=True, exist_ok=True)
    md = (header + "\n\n" if header else "") + markdown_table(rows, title=plan_name)
    paths = {
        "md": atomic_write_text(out / "results.md", md),
        "csv": atomic_write_text(out / "results.csv", csv_text(rows)),
        "json": atomic_write_json(out / "results.json", {"plan": plan_name, "rows": rows}),
    }
    png = plot(rows, out / "results.png", title=f"folnet ablate: {plan_name}")
    if png is not None:
        paths["png"] = png
    return paths


def read_rows(out: Path) -> list[dict[str, Any]]:
    path = out / "results.json"
    return json.loads(path.read_text())["rows"] if path.is_file() else []
