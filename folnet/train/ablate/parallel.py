"""``folnet ablate --jobs N``: every seed of every row in a process of its own, N at a time,
none of them outliving the ablate that started it.

Each seed runs as ``folnet ablate OUT/plan.json --rows ROW --seed-of-row S --parent-pid PID``
(the children read the effective plan, command-line overrides included), in a session of its
own, and arms a parent-death signal at start-up (`folnet.train.engine.procs`): killing the
ablate in any way, SIGKILL included, ends its seeds; SIGTERM or Ctrl-C stops them in order
first. A seed process holds its seed's lock (`folnet.train.ablate.rows`), so a rerun of the
ablate never starts a seed that a live process is still running: it says so and leaves the
seed out of that run. The seeds come in the order they are given (`folnet.train.ablate.run`
gives the costliest rows' first), each process starting as soon as one ends.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from folnet.train.ablate.plan import AblationRow
from folnet.train.ablate.rows import open_row_log, row_log, running_message, seed_dir, seed_holder
from folnet.train.engine.memory_budget import SHARE_ENV
from folnet.train.engine.procs import stop_processes

__all__ = ["KILLED_RETRIES", "ParallelOutcome", "run_parallel", "unit_command"]

POLL_SECONDS = 0.5
STOP_GRACE_SECONDS = 10.0
#: How often a seed whose process was killed by a signal (the OOM killer, a preemption, a
#: stray kill) is run again, resuming from its checkpoints, before it counts as failed. An
#: exit with a status (an error the seed itself reported) is not retried: it would recur.
KILLED_RETRIES = 2


@dataclass
class ParallelOutcome:
    """Seeds that did not finish: failed ones, and ones another live process is running."""

    failed: list[str] = field(default_factory=list)  # "row 'x' seed s"
    busy: list[str] = field(default_factory=list)  # what `running_message` says of each
    retried: list[str] = field(default_factory=list)  # seeds run again after a kill, and why


Unit = tuple[AblationRow, int]  # a row and one of its seeds


def _label(unit: Unit) -> str:
    return f"row {unit[0].name!r} seed {unit[1]}"


def unit_command(out: Path, row: AblationRow, seed: int, parent_pid: int) -> list[str]:
    """The command line that runs one seed of one row (and resumes it when run again) in a
    process of its own that ends with ``parent_pid``; shared by every executor."""
    return [sys.executable, "-m", "folnet", "ablate", str(out / "plan.json"), "--out", str(out),
            "--rows", row.name, "--seed-of-row", str(seed), "--jobs", "1", "--no-report",
            "--no-progress", "--parent-pid", str(parent_pid)]


def _spawn(unit: Unit, out: Path, env: dict[str, str]) -> subprocess.Popen:
    row, seed = unit
    cmd = unit_command(out, row, seed, os.getpid())
    log = open_row_log(out, row, seed)
    try:
        return subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                start_new_session=True)
    finally:
        os.close(log)  # the child has its own copy


def _start(unit: Unit, out: Path, env: dict[str, str], outcome: ParallelOutcome
           ) -> subprocess.Popen | None:
    """The unit's process, or None (and why, printed) when it is finished or held."""
    row, seed = unit
    done = seed_dir(out, row, seed) / "result.json"
    if done.is_file():  # finished by another ablate since the units were listed
        print(f"[{row.name}] seed {seed} finished earlier: {done}", flush=True)
        return None
    if (holder := seed_holder(out, row, seed)) is not None:
        outcome.busy.append(running_message(row, seed, holder))
        print(f"== {outcome.busy[-1]}; not started again", flush=True)
        return None
    proc = _spawn(unit, out, env)
    print(f"== started {_label(unit)} (pid {proc.pid}, log: {row_log(out, row)})", flush=True)
    return proc


def _signal_name(returncode: int) -> str | None:
    """The signal that ended a process (a negative status), by name; None for an exit."""
    if returncode >= 0:
        return None
    try:
        return signal.Signals(-returncode).name
    except ValueError:
        return f"signal {-returncode}"


def _ended(unit: Unit, proc: subprocess.Popen, out: Path, outcome: ParallelOutcome,
           retries_left: int) -> bool:
    """Say how the unit's process ended; True when it is to run again (killed by a signal,
    with retries left: the rerun resumes from the seed's checkpoints)."""
    row, seed = unit
    if proc.returncode == 0:
        print(f"== {_label(unit)}: done", flush=True)
        return False
    holder = seed_holder(out, row, seed)  # lost a race to another ablate's seed process?
    killer = _signal_name(proc.returncode)
    if holder is not None:
        outcome.busy.append(running_message(row, seed, holder))
        print(f"== {outcome.busy[-1]}; not run here", flush=True)
    elif killer is not None and retries_left > 0:
        outcome.retried.append(f"{_label(unit)} (its process ended by {killer})")
        print(f"== {_label(unit)}: its process was ended by {killer}; running it again from "
              f"its checkpoints ({retries_left - 1} more such retry(ies) allowed)", flush=True)
        return True
    else:
        outcome.failed.append(_label(unit))
        print(f"== {_label(unit)}: FAILED (exit status {proc.returncode}; log: "
              f"{row_log(out, row)})", flush=True)
    return False


def run_parallel(units: Sequence[Unit], out: Path, jobs: int) -> ParallelOutcome:
    """Run ``units`` (row, seed) in ``jobs`` processes at a time, each given its share of the
    CPU threads; a seed whose process a signal killed runs again up to `KILLED_RETRIES`
    times. On any exception (SIGTERM via `folnet.train.engine.procs.sigterm_exits`, Ctrl-C)
    the running seeds are stopped before it propagates."""
    threads = max(1, (os.cpu_count() or 1) // jobs)
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads),
           "PYTHONUNBUFFERED": "1",  # a seed killed mid-run keeps its log up to the kill
           SHARE_ENV: str(jobs)}  # each seed's 'auto' memory budget is its share
    pending = list(units)
    running: list[tuple[Unit, subprocess.Popen]] = []
    outcome = ParallelOutcome()
    retries = {(row.name, seed): KILLED_RETRIES for row, seed in units}
    try:
        while pending or running:
            while pending and len(running) < jobs:
                unit = pending.pop(0)
                if (proc := _start(unit, out, env, outcome)) is not None:
                    running.append((unit, proc))
            time.sleep(POLL_SECONDS)
            for item in list(running):
                if item[1].poll() is not None:
                    running.remove(item)
                    key = (item[0][0].name, item[0][1])
                    if _ended(*item, out, outcome, retries[key]):
                        retries[key] -= 1
                        pending.insert(0, item[0])
    except BaseException:
        if running:
            print(f"== stopping {len(running)} running seed(s): "
                  f"{', '.join(_label(unit) for unit, _ in running)}", flush=True)
            stop_processes([proc for _, proc in running], grace=STOP_GRACE_SECONDS)
            print("== stopped; the same command resumes them", flush=True)
        raise
    return outcome
