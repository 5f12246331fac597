"""`folnet ablate --executor slurm` on a REAL one-node SLURM started for the module
(tests/slurm_cluster.py), and ``--executor local`` (submitit's LocalExecutor).

On SLURM: one job array, a task per row x seed (squeue and the job-completion records printed
and asserted); one task requeued while it pretrains (``scontrol requeue``) resumes from its own
checkpoint and finishes, and another preempted (SIGUSR2, answered by submitit's checkpointing
protocol) does too; the report equals that of ``--executor processes --jobs 1`` of the
same plan (rows and seeds exactly, every metric and loss within 1e-6); a rerun submits nothing,
and after one seed's result is deleted, a one-task submission for that seed alone; Ctrl-C cancels
the array and exits 130. (sacct needs a slurmdbd, which this cluster has not: the completion
records of jobcomp/filetxt stand in for it.)

Marked ``slow`` and ``cluster``: ``make test-cluster`` runs them, ``make test`` leaves them out.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from paths import ROOT
from runs import tiny_plan
from slurm_cluster import SlurmCluster, install_reason, start_cluster

pytest.importorskip("submitit", reason="needs submitit: pip install 'folnet[cluster]'")
pytestmark = [pytest.mark.slow(seconds=300), pytest.mark.cluster]

# one row, two seeds: pretraining long enough (24 steps, a checkpoint every 4) for the test to
# requeue seed 0 after its first checkpoint and before its end
PLAN = tiny_plan("slurm", '\n[[rows]]\nops = "j.a"\nname = "first"\n', seeds=2, steps=24,
                 save_every=4)
TOLERANCE = 1e-6


@pytest.fixture(scope="module")
def cluster(tmp_path_factory) -> SlurmCluster:
    reason = install_reason()
    if reason is not None:
        pytest.skip(reason)
    root = tmp_path_factory.mktemp("slurm")
    os.chmod(root, 0o700)  # munged refuses a key folder others may write to
    cluster = start_cluster(root)
    try:
        # the cluster itself first: a plain three-task array runs
        job = cluster.run("sbatch", "--parsable", "--array=0-2", "--output",
                          f"{root}/hostname-%A_%a.out", "--wrap", "hostname").strip()
        _wait_gone(cluster, job, 60)
        outs = sorted(root.glob(f"hostname-{job}_*.out"))
        assert len(outs) == 3 and all(p.read_text().strip() for p in outs), cluster.logs()
        yield cluster
    finally:
        cluster.stop()


def _wait_gone(cluster: SlurmCluster, job: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while cluster.run("squeue", "-h", "-j", job, check=False).strip():
        assert time.monotonic() < deadline, f"job {job} still queued:\n{cluster.logs()}"
        time.sleep(0.5)


def _env(cluster: SlurmCluster) -> dict[str, str]:
    return {**cluster.env, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}


def _ablate(cluster: SlurmCluster, plan: Path, out: Path, *extra: str) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "folnet", "ablate", str(plan), "--out", str(out),
           "--no-progress", *extra]
    return subprocess.Popen(cmd, env=_env(cluster), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, stdin=subprocess.DEVNULL,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def _finish(proc: subprocess.Popen, timeout: float = 400) -> str:
    out, _ = proc.communicate(timeout=timeout)
    print(out)
    assert proc.returncode == 0, out
    return out


def _array_of(text: str) -> str:
    """The job id of the array a parent submitted, from its 'as array task J_i' lines."""
    ids = {line.rsplit(" ", 1)[1].split("_")[0] for line in text.splitlines()
           if " as array task " in line}
    assert len(ids) == 1, text
    return ids.pop()


def _rows(out: Path) -> list[dict]:
    return json.loads((out / "results.json").read_text())["rows"]


def _numbers(value, path=""):
    """Every number of a metrics tree, by its path."""
    if isinstance(value, dict):
        for key, sub in sorted(value.items()):
            yield from _numbers(sub, f"{path}/{key}")
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        yield path, float(value)


def _same_report(mine: Path, theirs: Path) -> list[str]:
    """Rows and seeds equal, every metric, loss and loss curve within TOLERANCE; the
    comparison's lines (printed by the test)."""
    lines = []
    a, b = _rows(mine), _rows(theirs)
    assert [r["name"] for r in a] == [r["name"] for r in b]
    for ra, rb in zip(a, b, strict=True):
        assert [s["seed"] for s in ra["seeds"]] == [s["seed"] for s in rb["seeds"]]
        pairs = [*zip(_numbers(ra["metrics"]), _numbers(rb["metrics"]), strict=True)]
        for sa, sb in zip(ra["seeds"], rb["seeds"], strict=True):
            pairs.append(((f"seed {sa['seed']} final_loss", sa["final_loss"]),
                          (f"seed {sb['seed']} final_loss", sb["final_loss"])))
            pairs += [((f"seed {sa['seed']} loss step {i}", x[1]), ("", y[1]))
                      for i, (x, y) in enumerate(zip(sa["loss_curve"], sb["loss_curve"],
                                                     strict=True))]
        worst = max(abs(x[1] - y[1]) for x, y in pairs)
        for (name, x), (_, y) in pairs:
            assert abs(x - y) <= TOLERANCE, f"{ra['name']} {name}: {x} vs {y}"
        acc = ra["metrics"]["kinship"]["accuracy"]
        lines.append(f"{ra['name']}: {len(pairs)} numbers compared, largest difference "
                     f"{worst:.3g}; accuracy {acc['mean']:.4f} ± {acc['std']:.4f} "
                     f"(processes: {rb['metrics']['kinship']['accuracy']['mean']:.4f})")
    assert (mine / "results.md").read_text().count("| 1 |") == \
        (theirs / "results.md").read_text().count("| 1 |")
    return lines


def _checkpointed(out: Path, seed: int) -> bool:
    checkpoints = out / "rows" / "first" / f"seed_{seed}" / "pretrain" / "checkpoints"
    return checkpoints.is_dir() and any(p.name.startswith("step_")
                                        for p in checkpoints.iterdir())


def _interrupt_when_checkpointed(cluster: SlurmCluster, out: Path, proc: subprocess.Popen
                                 ) -> list[str]:
    """Once both seeds' pretrainings have a checkpoint: requeue seed 0's task from outside
    (``scontrol requeue``) and preempt seed 1's (SIGUSR2, SLURM's warning signal, which
    submitit answers with `UnitTask.checkpoint` and a requeue); the two task ids."""
    deadline = time.monotonic() + 300
    while not (_checkpointed(out, 0) and _checkpointed(out, 1)):
        assert proc.poll() is None, proc.stdout.read()
        assert time.monotonic() < deadline, "the seeds wrote no checkpoint"
        time.sleep(0.2)
    lines = cluster.run("squeue", "-h", "-r", "-o", "%i %T %j").split("\n")
    print("squeue while running:", *lines, sep="\n  ")
    tasks = {line.split()[0]: line.split()[1] for line in lines if line.strip()}
    assert len(tasks) == 2 and all("_" in t for t in tasks), tasks  # one array, 2 tasks
    assert set(tasks.values()) == {"RUNNING"}, tasks
    for seed in (0, 1):
        assert not (out / "rows" / "first" / f"seed_{seed}" / "pretrain" / "final").exists()
    first, second = sorted(tasks)
    cluster.run("scontrol", "requeue", first)
    cluster.run("scancel", "--signal=USR2", second)
    # SLURM holds a requeued batch job back two minutes (its BeginTime); release them now
    deadline = time.monotonic() + 120
    for task in (first, second):
        while "PENDING" not in cluster.run("squeue", "-h", "-j", task, "-o", "%T",
                                           check=False):
            assert time.monotonic() < deadline, cluster.logs()
            time.sleep(0.5)
        cluster.run("scontrol", "update", f"JobId={task}", "StartTime=now")
    return [first, second]


def test_slurm_array_requeue_resume_report_rerun(cluster, tmp_path):
    plan = tmp_path / "plan.toml"
    plan.write_text(PLAN)
    out = tmp_path / "slurm"
    proc = _ablate(cluster, plan, out, "--executor", "slurm", "--time", "20",
                   "--cpus-per-task", "1", "--mem-gb", "2", "--partition", "debug",
                   "--max-parallel", "2")
    tasks = _interrupt_when_checkpointed(cluster, out, proc)
    text = _finish(proc)
    job = _array_of(text)
    assert f"submitted row 'first' seed 0 as array task {job}_0" in text
    assert f"submitted row 'first' seed 1 as array task {job}_1" in text
    records = [line for line in (cluster.root / "jobcomp.txt").read_text().splitlines()
               if f"ArrayJobId={job} " in line]
    print("job completion records (sacct stands in):",
          *[" ".join(w for w in r.split() if w.split("=")[0] in
                     ("JobId", "JobState", "ArrayJobId", "ArrayTaskId", "ExitCode"))
            for r in records], sep="\n  ")
    states = [(r.split("ArrayTaskId=")[1].split()[0], r.split("JobState=")[1].split()[0])
              for r in records]
    # each task's first run ends requeued (PENDING again), its second completes
    assert sorted(states) == [("0", "COMPLETED"), ("0", "PENDING"), ("1", "COMPLETED"),
                              ("1", "PENDING")], states
    assert [t.split("_")[1] for t in tasks] == ["0", "1"]
    log = (out / "first.log").read_text()
    for seed in (0, 1):  # both restarted the same unit, which resumed from its checkpoint
        assert f"row 'first' seed {seed} started again" in log
        assert f"seed_{seed}/pretrain/checkpoints/step_" in log
    assert log.count("resumed from") == 2
    preempted = "".join(p.read_text() for p in
                        (tmp_path / "slurm.submitit").glob(f"{job}_1_0_log.*"))
    assert "Calling checkpoint method" in preempted and "SIGUSR2" in preempted

    reference = tmp_path / "processes"
    _finish(_ablate(cluster, plan, reference, "--executor", "processes", "--jobs", "1"))
    for line in _same_report(out, reference):
        print("report comparison:", line)

    again = _finish(_ablate(cluster, plan, out, "--executor", "slurm"))  # all done
    assert "nothing to submit" in again and "as array task" not in again
    (out / "rows" / "first" / "seed_1" / "result.json").unlink()
    (out / "rows" / "first" / "result.json").unlink()
    one = _finish(_ablate(cluster, plan, out, "--executor", "slurm"))
    # one unit: submitit sends it as a plain job (an array of one otherwise)
    assert "submitted row 'first' seed 1 as job " in one, one
    assert one.count("== submitted ") == 1 and "seed 0 finished earlier" in one
    _same_report(out, reference)


def test_ctrl_c_cancels_the_array(cluster, tmp_path):
    plan = tmp_path / "plan.toml"
    plan.write_text(PLAN.replace("steps = 24", "steps = 2000"))
    out = tmp_path / "cancelled"
    proc = _ablate(cluster, plan, out, "--executor", "slurm")
    deadline = time.monotonic() + 120
    while "RUNNING" not in cluster.run("squeue", "-h", "-o", "%T"):
        assert time.monotonic() < deadline and proc.poll() is None, cluster.logs()
        time.sleep(0.5)
    proc.send_signal(signal.SIGINT)
    text, _ = proc.communicate(timeout=60)
    print(text)
    assert proc.returncode == 130
    job = _array_of(text)
    last = text.strip().splitlines()[-1]
    assert last.startswith("folnet ablate: interrupted; cancelled job array") and \
        f"(scancel {job})" in last
    _wait_gone(cluster, job, 60)


@pytest.mark.skipif(shutil.which("true") is None, reason="needs a POSIX userland")
def test_local_executor_runs_every_unit(tmp_path):
    plan = tmp_path / "plan.toml"
    plan.write_text(tiny_plan("local", '\n[[rows]]\nops = "j.a"\nname = "first"\n', seeds=2))
    out = tmp_path / "local"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "folnet", "ablate", str(plan), "--out", str(out),
           "--no-progress", "--executor", "local", "--max-parallel", "2"]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=400)
    print(done.stdout, done.stderr)
    assert done.returncode == 0
    assert done.stdout.count(" as local job ") == 2
    (row,) = _rows(out)
    assert row["name"] == "first" and [s["seed"] for s in row["seeds"]] == [0, 1]
    assert len(list((tmp_path / "local.submitit").glob("*_result.pkl"))) == 2
    again = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert again.returncode == 0 and "nothing to submit" in again.stdout
