"""Record a demo's result for the documentation site, so that its figures come from a file.

Runs ``folnet ablate PLAN --jobs N --out OUT`` (what ``make demo`` and ``make demo-operators``
run), timing it, or with ``--record-only`` reads an OUT that such a run finished, and writes
``docs/figures/PLAN/``: the report files the run wrote (``results.md``, ``results.png``) and
``record.json`` -- the machine (CPU model, cores, torch), the date, the
command, its wall time, the CPU time of its processes and the load average around it (the
wall time of a run beside other work says little; the load says whether there was any). The
documentation's hook (docs/hooks/generated.py) renders the pages from these files, and
tests/project/test_docs_figures.py checks the README's figures against them.

    python benchmarks/demo_figures.py pretraining --out runs/demo
    python benchmarks/demo_figures.py demo --out runs/demo-operators
    python benchmarks/demo_figures.py pretraining --out runs/demo --record-only
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

from harness import machine, write_json

#: What the documentation keeps of a report (results.json, every seed's every question, runs to
#: megabytes; results.md holds every figure the pages show).
REPORT_FILES = ("results.md", "results.png")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("plan", help="a bundled plan name (pretraining, demo) or a TOML file")
    parser.add_argument("--out", required=True, help="the ablation's run directory")
    parser.add_argument("--jobs", type=int, default=2, help="seeds run at once (as make demo)")
    parser.add_argument("--dest", default="docs/figures",
                        help="where PLAN/ with the report and record.json is written")
    parser.add_argument("--record-only", action="store_true",
                        help="do not run: record the finished run in --out")
    args = parser.parse_args()

    command = [sys.executable, "-m", "folnet", "ablate", args.plan, "--jobs", str(args.jobs),
               "--out", args.out, "--no-progress"]
    wall = cpu = None
    load = None
    if not args.record_only:
        load_before = os.getloadavg()[0]
        started = time.perf_counter()
        subprocess.run(command, check=True)
        wall = round(time.perf_counter() - started, 1)
        used = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = round(used.ru_utime + used.ru_stime, 1)
        load = {"before": round(load_before, 2), "after_15min": round(os.getloadavg()[2], 2)}
    out = Path(args.out)
    missing = [name for name in REPORT_FILES if not (out / name).is_file()]
    if missing:
        sys.exit(f"{out} holds no finished report (missing {missing}): run the plan first")
    dest = Path(args.dest) / Path(args.plan).stem
    dest.mkdir(parents=True, exist_ok=True)
    for name in REPORT_FILES:
        shutil.copyfile(out / name, dest / name)
    # results.md names the plan file by its absolute path on the machine that ran it
    text = (dest / "results.md").read_text()
    (dest / "results.md").write_text(text.replace(str(Path.cwd()) + "/", ""))
    plan = json.loads((out / "plan.json").read_text()) if (out / "plan.json").is_file() else {}
    write_json(dest / "record.json", {
        "machine": machine(),
        "command": f"folnet ablate {args.plan} --jobs {args.jobs} --out {args.out}",
        "wall_s": wall,
        "cpu_s": cpu,
        "load": load,
        "plan": plan.get("name", Path(args.plan).stem),
        "seeds": plan.get("seeds"),
    })
    print(f"recorded {out} -> {dest}")


if __name__ == "__main__":
    main()
