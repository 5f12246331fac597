"""Turn row summaries (`folnet.train.ablate.summary`) into results.md, results.csv,
results.json and results.png.

Every metric is reported as mean ± seed std with its 95% bootstrap interval; under the table
the report says in words which differences between rows exceed their spread and which do not.
A [compare] plan's report leads with the pretraining gain of every row at every swept value
(`folnet.train.ablate.gain`) and its figure (accuracy against the swept value, pretrained and
scratch); then, per value, the table above of the pretrained rows, with the operator comparison
in words. Its csv has a line per row, arm and value.
"""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Any

from folnet.atomic_write import atomic_write_json, atomic_write_text
from folnet.train.ablate.figure import plot, plot_sweep
from folnet.train.ablate.gain import cell_of, gain_table, gain_text, gains
from folnet.train.ablate.plan import Compare
from folnet.train.ablate.summary import compare_rows, k_of, per_k

__all__ = ["compare_markdown", "csv_text", "markdown_table", "metric_columns", "per_k",
           "read_rows", "significance_text", "write_reports"]

#: The metrics whose pairwise differences the report spells out (when a task has them).
COMPARED = ("accuracy_seen", "accuracy_unseen")


def _fmt(value: Any, spec: str = ".3f") -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return format(value, spec)
    return str(value)


def _spread(s: dict[str, Any] | None, spec: str = ".3f", interval: bool = True) -> str:
    """``mean ± std [low, high]`` of a summary's spread."""
    if not s:
        return "-"
    text = f"{format(s['mean'], spec)} ± {format(s['std'], spec)}"
    if interval:
        text += f" [{format(s['low'], spec)}, {format(s['high'], spec)}]"
    return text


def metric_columns(rows: list[dict[str, Any]], *, by_k: bool = False) -> list[tuple[str, str]]:
    """(task, metric) pairs in first-seen order: the headline metrics, or (``by_k``) the
    per-chain-length ones of the kinship tasks, by k."""
    seen: list[tuple[str, str]] = []
    for row in rows:
        for task, metrics in row.get("metrics", {}).items():
            for name in metrics:
                if per_k(name) == by_k and (task, name) not in seen:
                    seen.append((task, name))
    if by_k:
        seen.sort(key=lambda tn: (tn[0], k_of(tn[1])))
    return seen


def _baselines(rows: list[dict[str, Any]]) -> dict[tuple[str, str], float]:
    return {(t, n): v for r in rows for t, b in r.get("baselines", {}).items()
            for n, v in b.items()}


def significance_text(rows: list[dict[str, Any]]) -> str:
    """Which differences between rows exceed their spread, in words."""
    lines: list[str] = []
    for task, metric in _compared(rows):
        diffs = compare_rows(rows, task, metric)
        if not diffs:
            continue
        real = sorted((d for d in diffs if d.real), key=lambda d: -d.diff)
        lines.append(f"**{task} {metric}** ({len(diffs)} pair(s) of rows compared):")
        for d in real:
            lines.append(f"- {d.better} is above {d.worse} by {d.diff:+.3f} (95% interval "
                         f"[{d.low:+.3f}, {d.high:+.3f}]): beyond the spread.")
        if len(real) < len(diffs):
            close = [d for d in diffs if not d.real]
            pairs = "; ".join(f"{d.better} vs {d.worse} ({d.diff:+.3f}, [{d.low:+.3f}, "
                              f"{d.high:+.3f}])" for d in close)
            lines.append(f"- within the spread (the interval of the difference holds 0), so "
                         f"not a finding: {pairs}.")
        if not real:
            lines.append("- no difference between rows exceeds the spread.")
        lines.append("")
    lines += _against_majority(rows)
    if not lines:
        return ""
    seeds = sorted({r.get("num_seeds", 1) for r in rows})
    head = ("Differences between rows: the 95% interval of each difference comes from a "
            "bootstrap over seeds and test questions (rows resampled independently; pairs not "
            f"corrected for multiple comparisons); {'/'.join(map(str, seeds))} seed(s) per row.")
    if seeds == [1]:
        head += " With one seed per row only the question-level noise is counted."
    return head + "\n\n" + "\n".join(lines)


def _against_majority(rows: list[dict[str, Any]]) -> list[str]:
    """How far each row is above the majority class on the compared metrics, in standard
    errors (the 95% interval's half-width / 1.96)."""
    baselines = _baselines(rows)
    lines = []
    for task, metric in _compared(rows):
        majority = baselines.get((task, metric.replace("accuracy", "majority_baseline")))
        if majority is None:
            continue
        parts = []
        for r in rows:
            s = r.get("metrics", {}).get(task, {}).get(metric)
            if s is None:
                continue
            se = (s["high"] - s["low"]) / (2 * 1.96)
            z = (s["mean"] - majority) / se if se > 0 else float("inf")
            parts.append(f"{r['name']} {z:.0f} SE" if z != float("inf") else
                         f"{r['name']} (no spread)")
        if parts:
            lines.append(f"Above the majority class ({majority:.3f}) on {task} {metric}: "
                         + ", ".join(parts) + ".")
    return lines + ([""] if lines else [])


def _compared(rows: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """The (task, metric) pairs the report compares: `COMPARED` where a task has them, else
    the task's first (headline) metric."""
    columns = metric_columns(rows)
    out = []
    for task in dict.fromkeys(t for t, _ in columns):
        names = [n for t, n in columns if t == task]
        out += [(task, n) for n in (([n for n in names if n in COMPARED]) or names[:1])]
    return out


def markdown_table(rows: list[dict[str, Any]], *, title: str = "") -> str:
    """The Table 3-like table (mean ± std [95% interval] over seeds), the accuracy per chain
    length for the kinship tasks, and which differences are real."""
    metrics = metric_columns(rows)
    papers = sorted({k for r in rows for k in r.get("paper", {})})
    head = ["#", "Model", "Params", "PE", "D2", "Loss", "Seeds", "FLOPs/token", "tokens/s",
            "pretraining loss"]
    head += [f"{task} {name}" for task, name in metrics]
    head += [f"paper {k}" for k in papers]
    lines = [f"### {title}", ""] if title else []
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for i, r in enumerate(rows, 1):
        tps = r.get("tokens_per_s")
        cells = [str(i), f"FOLNet: {r['ops']}", f"{r['params'] / 1e6:.2f}M",
                 r["position"].upper(), str(r["D2"]), r["loss"], str(r.get("num_seeds", 1)),
                 f"{r['flops_per_token'] / 1e6:.1f}M", _spread(tps, ".0f", interval=False),
                 _spread(r.get("mlm_loss") or r.get("final_loss"))]
        cells += [_spread(r.get("metrics", {}).get(t, {}).get(n)) for t, n in metrics]
        cells += [_fmt(r.get("paper", {}).get(k)) for k in papers]
        lines.append("| " + " | ".join(cells) + " |")
    baselines = _baselines(rows)
    if baselines:
        lines += ["", "Majority class on the same questions: " + ", ".join(
            f"{t} {n} {v:.3f}" for (t, n), v in sorted(baselines.items()) if not per_k(n))]
    by_k = metric_columns(rows, by_k=True)
    if by_k:
        ks = [k_of(n) for _, n in by_k]
        lines += ["", "Accuracy per chain length k, mean ± seed std (trained on the seen "
                  "lengths; intervals in results.csv and results.json):", "",
                  "| # | Model | " + " | ".join(f"k={k}" for k in ks) + " |",
                  "|" + "---|" * (len(ks) + 2)]
        for i, r in enumerate(rows, 1):
            cells = [_spread(r.get("metrics", {}).get(t, {}).get(n), interval=False)
                     for t, n in by_k]
            lines.append(f"| {i} | {r['name']} | " + " | ".join(cells) + " |")
        majority = [baselines.get((t, n.replace("accuracy", "majority_baseline")))
                    for t, n in by_k]
        if any(m is not None for m in majority):
            lines.append("| - | majority class | " + " | ".join(_fmt(m) for m in majority)
                         + " |")
    words = significance_text(rows)
    if words:
        lines += ["", words]
    return "\n".join(lines).rstrip() + "\n"


def csv_text(rows: list[dict[str, Any]]) -> str:
    """One line per row; every metric as mean, std, low and high columns."""
    fields = ["name", "ops", "position", "D2", "loss", "num_seeds", "params",
              "flops_per_token", "pretrain_seconds", "finetune_seconds"]
    if any("arm" in r for r in rows):  # the cells of a [compare] plan
        fields[1:1] = ["arm", "value", "pretrain_steps"]
    spreads = [("", "tokens_per_s"), ("", "mlm_loss")]
    spreads += metric_columns(rows) + metric_columns(rows, by_k=True)
    buf = io.StringIO()
    writer = csv.writer(buf)
    writer.writerow(fields + [f"{t + '/' if t else ''}{n}/{part}" for t, n in spreads
                              for part in ("mean", "std", "low", "high")])
    for r in rows:
        values = []
        for t, n in spreads:
            s = r.get(n) if not t else r.get("metrics", {}).get(t, {}).get(n)
            values += [None if s is None else s[part] for part in ("mean", "std", "low", "high")]
        writer.writerow([r.get(f) for f in fields] + values)
    return buf.getvalue()


def _cells(rows: list[dict[str, Any]], arm: str, value: Any) -> list[dict[str, Any]]:
    return [c for r in rows if (c := cell_of(r, arm, value)) is not None]


def _scratch_words(rows: list[dict[str, Any]], compare: Compare) -> str:
    """How much the scratch arm pretrained, from its seeds' records."""
    updates = {s.get("pretrain_updates") for v in compare.values
               for c in _cells(rows, "scratch", v) for s in c.get("seeds", ())}
    text = f"The scratch arm pretrains {compare.scratch_steps} step(s)"
    if updates == {0}:
        return text + (" at learning rate 0 (the warmup's first step): its weights are the "
                       "initialisation, its tokenizer the pretrained arm's.")
    return text + f" ({', '.join(map(str, sorted(u for u in updates if u is not None)))} " \
                  f"update(s) at a learning rate above 0); its tokenizer is the pretrained arm's."


def compare_markdown(rows: list[dict[str, Any]], compare: Compare, *,
                     title: str = "") -> tuple[str, list[Any]]:
    """The [compare] report: the pretraining gain (table and words), then per swept value the
    pretrained rows' table and operator comparison; and the gains, for results.json."""
    pretrained = [c for v in compare.values for c in _cells(rows, "pretrained", v)]
    found = [g for task, metric in _compared(pretrained)
             for g in gains(rows, compare.values, task, metric)]
    seeds = sorted({g.seeds for g in found})
    lines = [f"### {title}", ""] if title else []
    lines += ["Pretraining gain: pretrained minus scratch accuracy on the same test questions. "
              "Each seed's two arms share the initial weights, the corpus, the tokenizer and "
              "the finetuning seed; the 95% interval is a paired bootstrap (seeds drawn once "
              "for both arms, and each drawn seed's questions once for both; "
              f"{'/'.join(map(str, seeds)) or '-'} seed(s) per cell; * marks an interval that "
              f"excludes 0). {_scratch_words(rows, compare)}", "",
              gain_table(found, compare.option), "", gain_text(found, compare.option), ""]
    for value in compare.values:
        at = f", {compare.option} = {value}" if compare.option is not None else ""
        cells = _cells(rows, "pretrained", value)
        if cells:
            lines += [markdown_table(cells, title=f"Pretrained rows{at}"), ""]
    return "\n".join(lines).rstrip() + "\n", found


def write_reports(rows: list[dict[str, Any]], out: Path, *, plan_name: str,
                  header: str = "", compare: Compare | None = None) -> dict[str, Path]:
    """Write every report file into ``out``; returns their paths."""
    out.mkdir(parents=True, exist_ok=True)
    if compare is not None:
        return _write_compare(rows, out, plan_name=plan_name, header=header, compare=compare)
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


def _write_compare(rows: list[dict[str, Any]], out: Path, *, plan_name: str, header: str,
                   compare: Compare) -> dict[str, Path]:
    body, found = compare_markdown(rows, compare, title=plan_name)
    cells = [c for r in rows for c in r.get("cells", ())]
    paths = {
        "md": atomic_write_text(out / "results.md", (header + "\n\n" if header else "") + body),
        "csv": atomic_write_text(out / "results.csv", csv_text(cells)),
        "json": atomic_write_json(out / "results.json", {
            "plan": plan_name, "rows": rows, "gains": [g.to_dict() for g in found]}),
    }
    png = plot_sweep(rows, compare, _compared(cells), out / "results.png",
                     title=f"folnet ablate: {plan_name}")
    if png is not None:
        paths["png"] = png
    last = _cells(rows, "pretrained", compare.values[-1])
    by_k = plot(last, out / "results_by_k.png", title=f"folnet ablate: {plan_name}, pretrained "
                f"rows" + (f", {compare.option} = {compare.values[-1]}" if compare.option else ""))
    if by_k is not None:
        paths["png_by_k"] = by_k
    return paths


def read_rows(out: Path) -> list[dict[str, Any]]:
    path = out / "results.json"
    return json.loads(path.read_text())["rows"] if path.is_file() else []
