"""``folnet ablate --jobs N``: every row in a process of its own, N at a time, none of them
outliving the ablate that started it.

Each row runs as ``folnet ablate OUT/plan.json --rows ROW --parent-pid PID`` (the children read
the effective plan, command-line overrides included), in a session of its own, and arms a
parent-death signal at start-up (`folnet.train.engine.procs`): killing the ablate in any way,
SIGKILL included, ends its rows; SIGTERM or Ctrl-C stops them in order first. A row process
holds its row's lock (`folnet.train.ablate.rows`), so a rerun of the ablate never starts a row
that a live process is still running: it says so and leaves the row out of that run.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from folnet.train.ablate.plan import AblationRow
from folnet.train.ablate.rows import open_row_log, row_dir, row_holder, row_log, running_message
from folnet.train.engine.memory import SHARE_ENV
from folnet.train.engine.procs import stop_processes

__all__ = ["ParallelOutcome", "run_parallel"]

POLL_SECONDS = 0.5
STOP_GRACE_SECONDS = 10.0


@dataclass
class ParallelOutcome:
    """Rows that did not finish: failed ones, and ones another live process is running."""

    failed: list[str] = field(default_factory=list)
    busy: dict[str, dict[str, object]] = field(default_factory=dict)  # row name -> lock holder


def _spawn(row: AblationRow, out: Path, env: dict[str, str]) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "folnet", "ablate", str(out / "plan.json"), "--out", str(out),
           "--rows", row.name, "--jobs", "1", "--no-report", "--no-progress",
           "--parent-pid", str(os.getpid())]
    log = open_row_log(out, row)
    try:
        return subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                start_new_session=True)
    finally:
        os.close(log)  # the child has its own copy


def run_parallel(rows: Sequence[AblationRow], out: Path, jobs: int) -> ParallelOutcome:
    """Run ``rows`` in ``jobs`` processes at a time, each given its share of the CPU threads.
    Finished rows are skipped without a process; on any exception (SIGTERM via
    `folnet.train.engine.procs.sigterm_exits`, Ctrl-C) the running rows are stopped before
    it propagates."""
    threads = max(1, (os.cpu_count() or 1) // jobs)
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads),
           "PYTHONUNBUFFERED": "1",  # a row killed mid-run keeps its log up to the kill
           SHARE_ENV: str(jobs)}  # each row's 'auto' memory budget is its share
    pending = list(rows)
    running: list[tuple[AblationRow, subprocess.Popen]] = []
    outcome = ParallelOutcome()
    try:
        while pending or running:
            while pending and len(running) < jobs:
                row = pending.pop(0)
                done = row_dir(out, row) / "result.json"
                if done.is_file():
                    print(f"[{row.name}] finished earlier: {done}", flush=True)
                elif (holder := row_holder(out, row)) is not None:
                    outcome.busy[row.name] = holder
                    print(f"== {running_message(row, holder)}; not started again", flush=True)
                else:
                    proc = _spawn(row, out, env)
                    running.append((row, proc))
                    print(f"== started {row.name} (pid {proc.pid}, log: {row_log(out, row)})",
                          flush=True)
            time.sleep(POLL_SECONDS)
            for item in list(running):
                row, proc = item
                if proc.poll() is None:
                    continue
                running.remove(item)
                if proc.returncode == 0:
                    print(f"== {row.name}: done", flush=True)
                    continue
                holder = row_holder(out, row)  # lost a race to another ablate's row process?
                if holder is not None:
                    outcome.busy[row.name] = holder
                    print(f"== {running_message(row, holder)}; not run here", flush=True)
                else:
                    outcome.failed.append(row.name)
                    print(f"== {row.name}: FAILED (exit status {proc.returncode}; log: "
                          f"{row_log(out, row)})", flush=True)
    except BaseException:
        if running:
            print(f"== stopping {len(running)} running row(s): "
                  f"{', '.join(row.name for row, _ in running)}", flush=True)
            stop_processes([proc for _, proc in running], grace=STOP_GRACE_SECONDS)
            print("== stopped; the same command resumes them", flush=True)
        raise
    return outcome
