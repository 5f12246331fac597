"""`make demo` before and after a change, the way the README's figure is measured: fresh clones
of two commits, each clone's environment made first (`make setup`, not timed), then the demo
run in one clone after the other, alternating, for ``--rounds`` rounds.

Why clones and not worktrees of one checkout: a run must see only what the commit holds (no
stale build, no editable install of another tree), and each side keeps its own environment, so
the second round of a side starts from a warm disk cache as the first round of the other did.
Why alternating: the machines here are shared and their speed drifts over minutes; a drift then
falls on both sides alike.

Each run's record: wall time, the CPU time of every process the run started (the children's
resource usage), the rows' own time (the ablation's ``== N row(s) in S s`` line), and the seeds
the run's plan holds (its ``plan.json``). The JSON written is the ``make_demo.json`` that the
documentation's hook renders beside `benchmarks/train_step.py --against` tables (docs/hooks/
generated.py, ``demo_against``):

    python benchmarks/demo_ab.py f00006c HEAD --rounds 2 --work /tmp/demo-ab \\
        --json docs/figures/against-f00006c-NAME/make_demo.json
"""

from __future__ import annotations

import argparse
import json
import re
import resource
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from harness import machine, write_json

#: The ablation's closing line: how long its rows took, set-up and report excluded.
ROWS_LINE = re.compile(r"^== \d+ row\(s\) in (\d+) s$", re.MULTILINE)


@dataclass(frozen=True)
class Run:
    """One timed `make demo` (the fields the documentation's hook reads)."""

    side: str  # "before" or "after"
    clone: str
    commit: str
    seeds: int
    started: str
    wall_s: float
    cpu_s: float
    rows_s: int
    venv: str


def _git(*args: str, cwd: Path | None = None) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True,
                          text=True).stdout.strip()


def prepare(repo: Path, commit: str, where: Path, make: str) -> Path:
    """A fresh clone of ``repo`` at ``commit`` in ``where``, its environment made."""
    if where.exists():
        shutil.rmtree(where)
    _git("clone", "-q", str(repo), str(where))
    _git("checkout", "-q", commit, cwd=where)
    with open(where.parent / f"{where.name}-setup.log", "w") as log:
        subprocess.run([make, "setup"], cwd=where, stdout=log, stderr=subprocess.STDOUT,
                       check=True)
    return where


def rows_seconds(log: str) -> int:
    """The rows' time from an ablation's output; a log without the line is an error."""
    found = ROWS_LINE.findall(log)
    if not found:
        raise ValueError("the demo's output has no '== N row(s) in S s' line: did it finish?")
    return int(found[-1])


def run_demo(clone: Path, side: str, commit: str, round_: int, make: str, target: str) -> Run:
    """Time ``make TARGET`` in ``clone``; its output goes to ``<clone>-round<r>.log``. The
    Makefile's demo targets write their ablation to ``runs/<target>`` (demo, demo-operators)."""
    demo_out = clone / "runs" / target
    if demo_out.exists():
        shutil.rmtree(demo_out)  # every round from the start, as a fresh clone runs it
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.strftime("%H:%M:%S")
    begin = time.perf_counter()
    done = subprocess.run([make, target], cwd=clone, capture_output=True, text=True,
                          check=False)
    wall = time.perf_counter() - begin
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    (clone.parent / f"{clone.name}-round{round_}.log").write_text(done.stdout + done.stderr)
    if done.returncode != 0:
        raise RuntimeError(f"make {target} in {clone} failed ({done.returncode}); see "
                           f"{clone.parent / f'{clone.name}-round{round_}.log'}")
    plan = json.loads((demo_out / "plan.json").read_text())
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    return Run(side=side, clone=clone.name, commit=commit, seeds=int(plan["seeds"]),
               started=started, wall_s=round(wall, 2), cpu_s=round(cpu, 1),
               rows_s=rows_seconds(done.stdout), venv="made before the run (make setup)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("before", help="the commit before the change")
    parser.add_argument("after", help="the commit after it (HEAD: this checkout's)")
    parser.add_argument("--repo", default=".", help="the repository to clone (default: .)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--work", required=True, help="an empty folder for the clones and logs")
    parser.add_argument("--json", required=True, help="where make_demo.json is written")
    parser.add_argument("--make", default="make", help="the make program (default: make)")
    parser.add_argument("--target", default="demo", help="the make target to time")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error(f"--rounds {args.rounds}: at least 1")
    work = Path(args.work)
    if work.exists() and any(work.iterdir()):
        parser.error(f"--work {str(work)!r} is not empty: its clones would be replaced")
    work.mkdir(parents=True, exist_ok=True)
    repo = Path(args.repo).resolve()
    commits = {side: _git("rev-parse", "--short", name, cwd=repo)
               for side, name in (("before", args.before), ("after", args.after))}
    clones = {side: prepare(repo, sha, work / f"{side}-{sha}", args.make)
              for side, sha in commits.items()}
    runs: list[Run] = []
    for round_ in range(1, args.rounds + 1):
        for side in ("before", "after"):
            runs.append(run_demo(clones[side], side, commits[side], round_, args.make,
                                 args.target))
            print(json.dumps(asdict(runs[-1])), flush=True)
    write_json(args.json, {
        "machine": machine(),
        "command": (f"git clone; make setup (not timed); make {args.target}, {args.before} "
                    f"and {args.after} alternating, {args.rounds} round(s)"),
        "runs": [asdict(r) for r in runs]})
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
