"""The report of benchmarks/gpu_check.py: DIR/report.json and a short DIR/report.md, both
rewritten (atomically) whenever a stage adds a result, so that a run killed at its time limit
still leaves what it measured.

A stage's child process writes events, one JSON object per line, to a rows file the check
reads as they come (`Report.apply`): ``{"op": "append", "key": K, "value": V}`` appends V to
the stage's list K, ``{"op": "set", ...}`` sets the stage's K to V.
"""

from __future__ import annotations

import math
import re
import time
from collections import Counter
from pathlib import Path

from harness import table, write_json

#: The stages in the order they run, with their titles.
STAGES = {
    "cuda_tests": "1. CUDA correctness (tests/ops/test_cuda.py)",
    "train_step": "2a. Training step (MLM + NSP, forward + backward + AdamW)",
    "speed": "2b. The step's launches, eager and compiled, beside BERT; the largest batch",
    "ops": "2c. Operators per backend, and one layer against the naive baseline",
    "generate": "2d. Generation: cached, static and compiled against recomputed",
    "pretrain": "3. Pretraining: tiny preset on the kinship corpus, fp32 and bf16",
}


class Report:
    """The check's one document; `write` after every change."""

    def __init__(self, out: Path, machine: dict, args: dict) -> None:
        self.out = out
        self.start = time.time()
        self.data: dict = {
            "schema": 1, "started": time.strftime("%Y-%m-%d %H:%M:%S"), "finished": False,
            "elapsed_s": 0.0, "machine": machine, "args": args, "notes": [],
            "stages": {name: {"title": title, "status": "pending"}
                       for name, title in STAGES.items()}}

    def stage(self, name: str) -> dict:
        return self.data["stages"][name]

    def apply(self, name: str, event: dict) -> None:
        stage = self.stage(name)
        if event.get("op") == "append":
            stage.setdefault(event["key"], []).append(event["value"])
        elif event.get("op") == "set":
            stage[event["key"]] = event["value"]

    def write(self, finished: bool = False) -> None:
        self.data["elapsed_s"] = round(time.time() - self.start, 1)
        self.data["finished"] = finished
        tests = self.stage("cuda_tests").get("tests", [])
        self.stage("cuda_tests")["summary"] = dict(Counter(t["outcome"] for t in tests))
        write_json(self.out / "report.json", self.data)
        tmp = self.out / "report.md.tmp"
        tmp.write_text(render(self.data))
        tmp.replace(self.out / "report.md")


def _num(value: object, fmt: str) -> str:
    if isinstance(value, (int, float)) and math.isfinite(value):
        return format(value, fmt)
    return "-"


def _rows(rows: list[dict], columns: list[tuple[str, str, str]]) -> str:
    """`harness.table` over rows that may lack a column or hold an error."""
    text = [{k: (_num(r.get(k), f) if f else str(r.get(k, "-"))) for k, _, f in columns}
            for r in rows]
    return table(text, [(k, h, "") for k, h, _ in columns])


def _summary(name: str, stage: dict) -> str:
    """One line of what a stage found, for the summary table."""
    if name == "cuda_tests":
        counts = stage.get("summary", {})
        return ", ".join(f"{n} {k}" for k, n in sorted(counts.items())) or "-"
    if name == "train_step":
        rows = [r for r in stage.get("rows", []) if "mfu" in r]
        best = max(rows, key=lambda r: r["mfu"], default=None)
        return "-" if best is None else (
            f"{len(rows)} cases; best MFU {best['mfu']:.1%} ({best['preset']} T {best['T']} "
            f"{best['dtype']})")
    if name == "ops":
        return f"{len(stage.get('rows', []))} operator cases, {len(stage.get('layers', []))} " \
               f"layer cases"
    if name == "generate":
        return "; ".join(f"{r['preset']}: x{r['speedup']:.1f}" + (
            f", static compiled x{r['compiled_speedup']:.1f}" if "compiled_speedup" in r else "")
            for r in stage.get("rows", []) if "speedup" in r) or "-"
    if name == "speed":
        steps = [r for r in stage.get("steps", []) if "step_ms" in r and r["model"] == "folnet"]
        best = min(steps, key=lambda r: r["step_ms"], default=None)
        census = [f"{r['preset']} {r['launch_ratio']:.2f}x BERT" for r in
                  stage.get("census", []) if "launch_ratio" in r]
        return "; ".join(census + ([] if best is None else [
            f"fastest folnet step {best['step_ms']:.1f} ms ({best['mode']}, {best['preset']} "
            f"T {best['T']})"]) + ([f"largest batch {stage['largest_batch']}"]
                                   if stage.get("largest_batch") else [])) or "-"
    cmp = stage.get("comparison")
    if not cmp:
        return "-"
    return (f"bf16 vs fp32 max rel diff {cmp['max_rel_diff']:.2%} (bound "
            f"{cmp['bound']:.0%}: {'within' if cmp['within_bound'] else 'OUTSIDE'})")


def _tests_section(stage: dict) -> list[str]:
    tests = stage.get("tests", [])
    lines = []
    bad = [t for t in tests if t["outcome"] in ("failed", "error")]
    for t in bad:
        first = t["message"].splitlines()[:3]
        lines.append(f"- **{t['outcome']}** `{t['test']}`: " + " / ".join(first))
    # skip reasons, grouped across operators ('j', 'm', ...) and cut at 160 characters
    reasons = Counter(re.sub(r"'[a-z]'", "'?'", t["message"])[:160] for t in tests
                      if t["outcome"] == "skipped")
    for reason, n in reasons.most_common(8):
        lines.append(f"- skipped x{n}: {reason}")
    notes = {k: v for t in tests for k, v in t.get("properties", {}).items()}
    lines += [f"- {k}: {v}" for k, v in notes.items()]
    if stage.get("running"):
        lines.append(f"- still running when stopped: `{stage['running']}`")
    worst = stage.get("tolerances", [])[:5]
    if worst:
        lines += ["", _rows(worst, [("test", "test", ""), ("what", "comparison", ""),
                                    ("share", "share of bound", ".3g")])]
    return lines


COLUMNS = {
    "train_step": [("preset", "preset", ""), ("T", "T", ""), ("dtype", "dtype", ""),
                   ("B", "B", ""), ("step_s", "step s", ".4f"),
                   ("tokens_per_s", "tokens/s", ",.0f"), ("mfu", "MFU (bf16 peak)", ".1%"),
                   ("mfu_info", "MFU (info FLOPs)", ".1%"),
                   ("peak_gib", "peak GiB", ".2f"), ("fit_gib", "fit est. GiB", ".2f"),
                   ("info_gib", "info est. GiB", ".2f"), ("error", "error", "")],
    "ops": [("op", "op", ""), ("backend", "backend", ""), ("dtype", "dtype", ""),
            ("T", "T", ""), ("ms", "fwd+bwd ms", ".2f"), ("gflops", "GFLOP/s", ",.0f"),
            ("peak_mb", "peak MiB", ",.0f"), ("error", "error", "")],
    "layers": [("impl", "layer", ""), ("preset", "preset", ""), ("T", "T", ""),
               ("B", "B", ""), ("ms", "fwd+bwd ms", ".2f"), ("peak_mb", "peak MiB", ",.0f"),
               ("error", "error", "")],
    "generate": [("preset", "preset", ""), ("new_tokens", "new tokens", ""),
                 ("cached_ms", "cached ms/token", ".2f"),
                 ("recomputed_ms", "recomputed ms/token", ".2f"), ("speedup", "speedup", ".1f"),
                 ("static_ms", "static ms/token", ".2f"),
                 ("static_compiled_ms", "static compiled ms/token", ".2f"),
                 ("compiled_speedup", "compiled over recomputed", ".1f"),
                 ("method", "recomputed timing", ""), ("error", "error", "")],
    "census": [("preset", "preset", ""), ("folnet_launches", "folnet launches", ""),
               ("bert_launches", "BERT launches", ""), ("launch_ratio", "ratio", ".2f"),
               ("folnet_kernels", "folnet CUDA kernels", ""),
               ("bert_kernels", "BERT CUDA kernels", ""), ("kernel_ratio", "ratio", ".2f"),
               ("folnet_syncs", "folnet syncs", ""), ("error", "error", "")],
    "steps": [("model", "model", ""), ("mode", "mode", ""), ("preset", "preset", ""),
              ("T", "T", ""), ("B", "B", ""), ("precision", "precision", ""),
              ("step_ms", "step ms", ".2f"), ("tokens_per_s", "tokens/s", ",.0f"),
              ("mfu", "MFU", ".1%"), ("kernels", "CUDA kernels", ""),
              ("first_step_s", "first step s", ".1f"),
              ("peak_gib", "peak GiB", ".2f"), ("error", "error", "")],
    "largest": [("B", "B", ""), ("step_ms", "step ms", ".2f"),
                ("tokens_per_s", "tokens/s", ",.0f"), ("mfu", "MFU", ".1%"),
                ("peak_gib", "peak GiB", ".2f"), ("fit_gib", "fit est. GiB", ".2f"),
                ("error", "error", "")],
    "pretrain": [("precision", "precision", ""), ("steps", "steps", ""),
                 ("first_loss", "first loss", ".3f"), ("last_loss", "last loss", ".3f"),
                 ("seconds", "seconds", ".1f"), ("tokens_per_s", "tokens/s", ",.0f"),
                 ("error", "error", "")],
}


def _details(name: str, stage: dict) -> list[str]:
    if name == "cuda_tests":
        return _tests_section(stage)
    lines = []
    keys = {"ops": ("rows", "layers"), "pretrain": ("runs",),
            "speed": ("census", "steps", "largest")}.get(name, ("rows",))
    for key in keys:
        rows = stage.get(key, [])
        if key == "census":  # the two models' counts side by side
            rows = [{**r, **{f"{m}_{k}": r.get(m, {}).get(k) for m in ("folnet", "bert")
                             for k in ("launches", "kernels", "syncs")}} for r in rows]
        if rows:
            lines += [_rows(rows, COLUMNS[key if key in ("layers", "census", "steps",
                                                         "largest") else name]), ""]
    for key in ("peaks", "comparison", "settings"):
        if key in stage:
            lines.append(f"- {key}: " + ", ".join(f"{k} {v:.4g}" if isinstance(v, float)
                                                  else f"{k} {v}"
                                                  for k, v in stage[key].items()))
    skipped = stage.get("skipped", []) + stage.get("not_run", [])
    if skipped:
        lines.append(f"- not run ({len(skipped)}): " + "; ".join(skipped[:8]))
    return lines


def render(data: dict) -> str:
    m = data["machine"]
    lines = [f"# folnet GPU check ({'finished' if data['finished'] else 'UNFINISHED'})", "",
             f"{m.get('gpu') or 'no GPU'}; torch {m.get('torch')}, CUDA {m.get('cuda_version')}"
             f"; started {data['started']}, {data['elapsed_s']} s of a "
             f"{data['args'].get('budget_s')} s budget"
             f"{'; DRY RUN on the CPU' if data['args'].get('dry_run') else ''}", ""]
    lines += [f"- {note}" for note in data.get("notes", [])]
    summary = [{"stage": s["title"].split(" ")[0] + " " + name, "status": s["status"],
                "seconds": s.get("seconds"), "result": _summary(name, s)}
               for name, s in data["stages"].items()]
    lines += ["", _rows(summary, [("stage", "stage", ""), ("status", "status", ""),
                                  ("seconds", "seconds", ".1f"), ("result", "result", "")])]
    for name, stage in data["stages"].items():
        lines += ["", f"## {stage['title']}", "", f"status: {stage['status']}", ""]
        if stage.get("error"):
            lines += ["```", stage["error"], "```"]
        lines += _details(name, stage)
    return "\n".join(lines) + "\n"
