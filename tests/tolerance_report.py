"""Every numerical bound of the tests against what two CPU kernel sets measured.

    python tests/tolerance_report.py NATIVE.jsonl OTHER.jsonl

reads the logs `tests/tolerances.py` writes under ``FOLNET_TOLERANCE_LOG`` (``make tolerances``
runs the tests marked ``numerics`` once per kernel set) and prints a Markdown table: one row per
test function and bound, with the largest share of the bound any of its comparisons used on
each kernel set. Rows above a tenth of their bound -- less than the 10x margin the project asks
for (docs/design.md section 9) -- are marked, but for token leads, whose required gap is itself
10x the logits' bound ("token lead" records gap / lead). Exit status 1 when a row is above its
bound.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

from tolerances import BF16_UNITS

MARGIN = 0.1


def _usage(line: dict) -> float:
    """Share of its bound a comparison used (1 = the bound itself)."""
    if line["metric"] in ("rel", "at most", "bf16 rel"):
        return line["measured"] / line["bound"] if line["bound"] else float("inf")
    return line["measured"]  # elementwise and token-lead records store the share already


def _bound(line: dict) -> str:
    if line["metric"] == "rel":
        return f"rel {line['bound']:.0e}"
    if line["metric"] == "bf16 rel":  # its bound is per comparison (tests/tolerances.py)
        return f"rel, {BF16_UNITS:g}x bf16's own"
    if line["metric"] == "at most":
        return f"<= {line['bound']:.0e}"
    return line["metric"]


def _function(test: str) -> str:
    """tests/ops/test_x.py::test_y[params] -> ops/test_x.py::test_y (the path within tests/, as
    docs/design.md section 9's table names the tests)"""
    path, _, name = test.partition("::")
    return re.sub(r"\[.*\]$", "", f"{path.removeprefix('tests/')}::{name}")


def _read(path: Path) -> dict[tuple[str, str], tuple[float, str]]:
    """(test function, bound) -> (largest share used, the comparison that used it)."""
    worst: dict[tuple[str, str], tuple[float, str]] = {}
    for raw in path.read_text(encoding="utf-8").splitlines():
        line = json.loads(raw)
        key = (_function(line["test"]), _bound(line))
        used = _usage(line)
        if key not in worst or used > worst[key][0]:
            worst[key] = (used, line["what"])
    return worst


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("native", type=Path, help="the log of the machine's own kernels")
    parser.add_argument("other", type=Path, help="the log of the second kernel set")
    parser.add_argument("--json", type=Path, default=None,
                        help="also write the rows, the counts and the machine to this file "
                        "(docs/figures/tolerances.json, which the design page renders)")
    args = parser.parse_args(argv)
    native, other = _read(args.native), _read(args.other)
    keys = sorted(native.keys() | other.keys())
    print("| test | bound | native: share of bound | other kernels: share of bound | worst "
          "comparison |")
    print("|---|---|---:|---:|---|")
    over = thin = 0
    rows = []
    for key in keys:
        a, b = native.get(key, (float("nan"), "-")), other.get(key, (float("nan"), "-"))
        worst = max((x for x in (a, b) if x[0] == x[0]), default=(float("nan"), "-"))
        flag = ""
        if worst[0] > 1:
            flag, over = " **over**", over + 1
        elif worst[0] > MARGIN and key[1] != "token lead":  # its gap is 10x a logits bound
            flag, thin = " **< 10x margin**", thin + 1
        print(f"| {key[0]} | {key[1]} | {a[0]:.2g} | {b[0]:.2g} | {worst[1]}{flag} |")
        rows.append({"test": key[0], "bound": key[1], "native": a[0], "other": b[0],
                     "worst": worst[1], "flag": flag.strip(" *")})
    print(f"\n{len(keys)} bounds; {over} exceeded, {thin} with less than a 10x margin "
          f"(largest share of a bound used on either kernel set above {MARGIN}).")
    if args.json is not None:
        _write_json(args.json, rows, over, thin)
    return 1 if over else 0


def _write_json(path: Path, rows: list[dict], over: int, thin: int) -> None:
    """The report as data, with when and where it was measured."""
    import os
    import platform
    import time

    import torch

    cpu = next((line.split(":", 1)[1].strip() for line in
                Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("model name")),
               platform.machine()) if Path("/proc/cpuinfo").exists() else platform.machine()
    machine = {"torch": torch.__version__, "cpu": platform.processor() or platform.machine(),
               "cpu_model": cpu, "cores": os.cpu_count(),
               "time": time.strftime("%Y-%m-%d %H:%M:%S")}  # as benchmarks/harness.py says it
    data = {"machine": machine, "margin": MARGIN, "bounds": len(rows),
            "exceeded": over, "thin": thin,
            "rows": [{k: (None if isinstance(v, float) and v != v else v) for k, v in r.items()}
                     for r in rows]}
    path.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    sys.exit(main())
