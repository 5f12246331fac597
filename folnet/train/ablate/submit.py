"""``folnet ablate --executor slurm|local``: the unfinished units of a plan submitted through
submitit -- on SLURM as the tasks of ONE job array, with ``local`` as jobs of submitit's
LocalExecutor on this machine -- and waited for, so that `folnet.train.ablate.run` then writes
the report exactly as after ``--jobs N``.

A unit is one seed of one row, as with ``--jobs N``, and not finer: a [compare] seed's
result.json is assembled from both of its arms by one run (`folnet.train.ablate.seeds.run_seed`
reads the pretrained arm's model for the seed's figures, and the paired gain needs both arms),
so an arm is not a unit that could finish on its own.

Each task runs the unit's own process (`folnet.train.ablate.parallel.unit_command`, its output
appended to the row's log) and is checkpointable in submitit's sense (`UnitTask.checkpoint`):
on preemption or timeout SLURM signals the task, submitit requeues the same unit, and the rerun
resumes from the unit's checkpoints (a pretraining from its latest step, a finished finetuning
read back). A task requeued from outside (``scontrol requeue``) restarts the same way. The
parent polls ``squeue`` (sacct needs a slurmdbd, which a small cluster may lack) until no task
of its array is left, then names the units that have no result.json. submitit's own files
(pickles, batch files, each task's log) go to ``OUT.submitit/`` beside OUT. Rerun, it submits only
those. Ctrl-C cancels the array it submitted (``scancel``) and exits 130.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from folnet.errors import FolnetError, Interrupted
from folnet.train.ablate.cluster import ClusterResources
from folnet.train.ablate.parallel import ParallelOutcome, unit_command
from folnet.train.ablate.plan import AblationRow
from folnet.train.ablate.rows import (
    open_row_log,
    row_log,
    running_message,
    seed_dir,
    seed_holder,
)
from folnet.train.engine.memory_budget import SHARE_ENV

__all__ = ["Cancelled", "UnitTask", "load_submitit", "run_submitted", "submitit_folder"]

POLL_SECONDS = 2.0
STOP_GRACE_SECONDS = 10.0
#: How long a task whose unit SLURM stopped with SIGTERM (a requeue, a cancel) waits for SLURM
#: to end it, rather than record a failure that the requeued task would then contradict.
KILLED_WAIT_SECONDS = 300.0

Unit = tuple[AblationRow, int]


class Cancelled(Interrupted):
    """Ctrl-C while waiting on submitted units: what was cancelled and how to go on (one
    line, exit 130), said as it is rather than as an interrupted local run."""


def load_submitit() -> Any:
    """The submitit module, or a `FolnetError` saying how to install it."""
    try:
        import submitit
    except ImportError:
        raise FolnetError("--executor slurm and --executor local need submitit (>= 1.5): "
                          "pip install 'folnet[cluster]'") from None
    return submitit


def submitit_folder(out: Path) -> Path:
    """Where submitit keeps its pickles, batch files and task logs: beside OUT, not in it
    (submitit links its batch files, and a run refuses links inside its --out)."""
    return out.parent / f"{out.name}.submitit"


def _label(row: AblationRow, seed: int) -> str:
    return f"row {row.name!r} seed {seed}"


class UnitTask:
    """One unit (a row's seed) as a submitit task: runs the unit's process and fails when it
    fails. Checkpointable: when SLURM preempts or times the task out, `checkpoint` stops the
    unit and hands submitit the same unit to requeue, which resumes from its checkpoints."""

    def __init__(self, out: Path, row: AblationRow, seed: int, threads: int) -> None:
        self.out, self.row, self.seed, self.threads = Path(out), row, seed, threads
        self._proc: subprocess.Popen | None = None

    def __getstate__(self) -> dict[str, Any]:  # the running process is not pickled
        return {k: v for k, v in self.__dict__.items() if k != "_proc"}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._proc = None

    def __call__(self) -> str:
        """Run (or resume) the unit; its label, or a `FolnetError` when it failed."""
        env = {**os.environ, "OMP_NUM_THREADS": str(self.threads),
               "MKL_NUM_THREADS": str(self.threads), "PYTHONUNBUFFERED": "1", SHARE_ENV: "1"}
        log = open_row_log(self.out, self.row, self.seed)
        try:
            self._proc = subprocess.Popen(
                unit_command(self.out, self.row, self.seed, os.getpid()), env=env,
                stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True,
                preexec_fn=_ignore_preemption_signal)
        finally:
            os.close(log)
        code = self._proc.wait()
        if code == 0:
            return _label(self.row, self.seed)
        if code == 128 + signal.SIGTERM and "SLURM_JOB_ID" in os.environ:
            time.sleep(KILLED_WAIT_SECONDS)  # SLURM requeues or cancels: it kills us first
        raise FolnetError(f"{_label(self.row, self.seed)} exited with status {code}; log: "
                          f"{row_log(self.out, self.row)}")

    def checkpoint(self, *args: Any, **kwargs: Any) -> Any:
        """submitit's hook on preemption or timeout: stop the unit in order (its lock
        released, its last checkpoint kept) and resubmit the same unit, which resumes."""
        from submitit.helpers import DelayedSubmission

        if self._proc is not None:
            _stop_group(self._proc.pid)
        return DelayedSubmission(UnitTask(self.out, self.row, self.seed, self.threads))


def _ignore_preemption_signal() -> None:
    """In the unit's process, before exec: SLURM's warning signal (USR2, sent to every process
    of the task) is the task's to handle (`UnitTask.checkpoint`), not a kill of the unit."""
    signal.signal(signal.SIGUSR2, signal.SIG_IGN)


def _stop_group(pid: int) -> None:
    """SIGTERM to the unit's process group, SIGKILL after `STOP_GRACE_SECONDS`. Reaps with
    waitpid, not Popen.wait: this runs in a signal handler that may have interrupted the
    task's own Popen.wait, whose lock it would wait on for ever."""
    try:
        os.killpg(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + STOP_GRACE_SECONDS
    while time.monotonic() < deadline:
        try:
            if os.waitpid(pid, os.WNOHANG)[0]:
                return
        except ChildProcessError:  # reaped already
            return
        time.sleep(0.1)
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _startable(units: Sequence[Unit], out: Path, outcome: ParallelOutcome) -> list[Unit]:
    """The units to submit: not finished since they were listed, not held by a live
    process (those are named in ``outcome.busy``)."""
    keep = []
    for row, seed in units:
        if (seed_dir(out, row, seed) / "result.json").is_file():
            continue
        if (holder := seed_holder(out, row, seed)) is not None:
            outcome.busy.append(running_message(row, seed, holder))
            print(f"== {outcome.busy[-1]}; not submitted again", flush=True)
            continue
        keep.append((row, seed))
    return keep


def _unfinished(units: Sequence[Unit], out: Path, where: Sequence[str]) -> list[str]:
    """The units without a result.json, each with where its task's output is."""
    return [f"{_label(row, seed)} did not finish ({place}; log: {row_log(out, row)})"
            for (row, seed), place in zip(units, where, strict=True)
            if not (seed_dir(out, row, seed) / "result.json").is_file()]


def _squeue(job_id: str) -> list[str]:
    """``TASK STATE`` of the array's tasks still queued or running ([] when none is)."""
    done = subprocess.run(["squeue", "-h", "-r", "-j", job_id, "-o", "%i %T"],
                          capture_output=True, text=True)
    if done.returncode != 0:
        if "Invalid job id" in done.stderr:  # finished long ago and purged
            return []
        raise FolnetError(f"squeue -j {job_id} failed: {done.stderr.strip()}")
    return [line for line in done.stdout.splitlines() if line.strip()]


def _wait_array(job_id: str) -> None:
    """Until no task of the array is left in squeue, a line each time their states change."""
    said = None
    while lines := _squeue(job_id):
        counts: dict[str, int] = {}
        for line in lines:
            state = line.split()[-1].lower()
            counts[state] = counts.get(state, 0) + 1
        now = ", ".join(f"{n} {state}" for state, n in sorted(counts.items()))
        if now != said:
            print(f"== job array {job_id}: {now}", flush=True)
            said = now
        time.sleep(POLL_SECONDS)


def _cancelled(what: str, out: Path) -> Cancelled:
    return Cancelled(f"interrupted; cancelled {what}; the finished units are kept in "
                       f"{str(out)!r}: run the same command again to submit the rest")


def _run_slurm(units: Sequence[Unit], out: Path, resources: ClusterResources) -> list[str]:
    """Submit ``units`` as one job array and wait for it; the units that did not finish."""
    submitit = load_submitit()
    executor = submitit.SlurmExecutor(folder=submitit_folder(out))
    try:
        executor.update_parameters(job_name=f"folnet-ablate-{out.name}",
                                   **resources.slurm_parameters())
    except ValueError as exc:
        raise FolnetError(f"submitit refused the [cluster] resources: {exc}") from None
    tasks = [UnitTask(out, row, seed, resources.cpus_per_task) for row, seed in units]
    with executor.batch():  # one sbatch --array; each task's callable is its own UnitTask,
        # so that submitit finds its checkpoint method (map_array would share one function)
        jobs = [executor.submit(task) for task in tasks]
    job_id = jobs[0].job_id.split("_")[0]
    for (row, seed), job in zip(units, jobs, strict=True):
        # (submitit sends a lone unit as a plain job, which squeue follows the same way)
        what = "array task" if "_" in job.job_id else "job"
        print(f"== submitted {_label(row, seed)} as {what} {job.job_id}", flush=True)
    try:
        _wait_array(job_id)
    except BaseException as exc:
        subprocess.run(["scancel", job_id], capture_output=True)
        if isinstance(exc, KeyboardInterrupt):
            raise _cancelled(f"job array {job_id} (scancel {job_id})", out) from None
        raise
    return _unfinished(units, out, [f"task {job.job_id}: {job.paths.stderr}"
                                    for job in jobs])


def _run_local(units: Sequence[Unit], out: Path, resources: ClusterResources) -> list[str]:
    """Run ``units`` as jobs of submitit's LocalExecutor, ``max_parallel`` at a time (default:
    this machine's cores over ``cpus_per_task``); the units that did not finish."""
    submitit = load_submitit()
    executor = submitit.LocalExecutor(folder=submitit_folder(out))
    executor.update_parameters(timeout_min=resources.time)
    parallel = resources.max_parallel or max(1, (os.cpu_count() or 1) // resources.cpus_per_task)
    threads = max(1, min(resources.cpus_per_task, (os.cpu_count() or 1) // parallel))
    pending, running, places = list(units), [], {}
    try:
        while pending or running:
            while pending and len(running) < parallel:
                row, seed = pending.pop(0)
                job = executor.submit(UnitTask(out, row, seed, threads))
                places[(row.name, seed)] = f"local job {job.job_id}: {job.paths.stderr}"
                print(f"== submitted {_label(row, seed)} as local job {job.job_id}", flush=True)
                running.append(job)
            time.sleep(POLL_SECONDS / 4)
            running = [job for job in running if not job.done()]
    except BaseException as exc:
        for job in running:
            job.cancel(check=False)
        if isinstance(exc, KeyboardInterrupt):
            raise _cancelled(f"{len(running)} local job(s)", out) from None
        raise
    return _unfinished(units, out, [places[(row.name, seed)] for row, seed in units])


def run_submitted(units: Sequence[Unit], out: Path, executor: str,
                  resources: ClusterResources) -> ParallelOutcome:
    """Run the unfinished ``units`` through submitit (``executor`` slurm or local) and wait for
    them; the outcome names those that did not finish and those another process holds."""
    outcome = ParallelOutcome()
    todo = _startable(units, out, outcome)
    if not todo:
        print("== nothing to submit: every unit has finished or is running elsewhere",
              flush=True)
        return outcome
    run = _run_slurm if executor == "slurm" else _run_local
    outcome.failed.extend(run(todo, out, resources))
    for line in outcome.failed:
        print(f"== {line}", flush=True)
    return outcome
