"""A real one-node SLURM in a temporary folder, for the cluster tests: munged with its own key,
socket and pid file, slurmctld and slurmd in the foreground (``-D``) as children of the test,
a slurm.conf that names only files under the folder, and free ports, so that it meets no
other SLURM or munge on the machine. `start_cluster` returns once ``sinfo`` shows the node
idle; `SlurmCluster.stop` kills every process it started.

The Debian packages (``slurm-wlm``, ``munge``) are installed with apt-get when ``slurmctld``
is absent and the test runs as root; `install_reason` says why not otherwise.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

PACKAGES = ("slurm-wlm", "munge")
PROGRAMS = ("slurmctld", "slurmd", "munged", "sbatch", "squeue", "sinfo", "scontrol", "scancel")


def install_reason() -> str | None:
    """None when SLURM and munge are there (installed now if need be), else why not."""
    if all(shutil.which(p) for p in PROGRAMS):
        return None
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        return f"SLURM is not installed and cannot be here (needs root and apt-get: {PACKAGES})"
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    cmd = ["apt-get", "install", "-y", "--no-install-recommends", *PACKAGES]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    if done.returncode != 0 or not all(shutil.which(p) for p in PROGRAMS):
        return f"apt-get install {' '.join(PACKAGES)} failed: {done.stderr.strip()[-300:]}"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _node_line() -> str:
    """``slurmd -C``'s description of this machine, as NodeName=localhost."""
    found = subprocess.run(["slurmd", "-C"], capture_output=True, text=True, check=True).stdout
    first = found.splitlines()[0]
    keep = [w for w in first.split() if w.split("=")[0] in
            ("CPUs", "Boards", "SocketsPerBoard", "CoresPerSocket", "ThreadsPerCore")]
    memory = int(re.search(r"RealMemory=(\d+)", first).group(1))
    return (f"NodeName=localhost NodeAddr=127.0.0.1 {' '.join(keep)} RealMemory={memory} "
            f"State=UNKNOWN")


def slurm_conf(root: Path, munge_socket: Path) -> str:
    """A minimal slurm.conf for one node, every file under ``root``."""
    return f"""ClusterName=folnettest
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort={_free_port()}
SlurmdPort={_free_port()}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={munge_socket}
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd.pid
SlurmctldLogFile={root}/slurmctld.log
SlurmdLogFile={root}/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/filetxt
JobCompLoc={root}/jobcomp.txt
ReturnToService=2
JobRequeue=1
KillWait=5
MinJobAge=600
SchedulerParameters=bf_interval=1
SlurmctldTimeout=30
SlurmdTimeout=30
{_node_line()}
PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP
"""


@dataclass
class SlurmCluster:
    """The running cluster: its folder, the environment its clients need, its processes."""

    root: Path
    env: dict[str, str]
    procs: list[subprocess.Popen] = field(default_factory=list)

    def run(self, *cmd: str, check: bool = True) -> str:
        """A SLURM client command's stdout, run against this cluster."""
        done = subprocess.run(cmd, env=self.env, capture_output=True, text=True, timeout=60)
        if check and done.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)}: {done.stderr.strip()}")
        return done.stdout

    def logs(self) -> str:
        """The daemons' logs, for a failing test's message."""
        return "\n".join(f"--- {p.name}\n{p.read_text()[-3000:]}"
                         for p in sorted(self.root.glob("*.log")))

    def stop(self) -> None:
        """Kill every daemon this cluster started (jobs still on it die with slurmd's kill)."""
        try:
            subprocess.run(["scancel", "--full", "-u", "root"], env=self.env, timeout=10,
                           capture_output=True)
        except (OSError, subprocess.SubprocessError):
            pass
        for proc in reversed(self.procs):
            if proc.poll() is None:
                proc.terminate()
        for proc in reversed(self.procs):
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _wait(what: str, test, cluster: SlurmCluster, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not test():
        for proc in cluster.procs:
            if proc.poll() is not None:
                raise RuntimeError(f"{proc.args[0]} exited ({proc.returncode}) before {what}:\n"
                                   f"{cluster.logs()}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}:\n{cluster.logs()}")
        time.sleep(0.5)


def start_cluster(root: Path) -> SlurmCluster:
    """munged, slurmctld and slurmd on a fresh slurm.conf under ``root``, the node idle."""
    for sub in ("state", "spool", "munge"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    munge = root / "munge"
    os.chmod(munge, 0o700)
    key, sock = munge / "munge.key", munge / "munge.socket"
    subprocess.run(["mungekey", "--create", "--keyfile", str(key)], check=True,
                   capture_output=True)
    os.chmod(key, 0o600)
    conf = root / "slurm.conf"
    conf.write_text(slurm_conf(root, sock))
    env = {**os.environ, "SLURM_CONF": str(conf)}
    cluster = SlurmCluster(root, env)
    quiet = {"stdin": subprocess.DEVNULL, "stdout": subprocess.DEVNULL,
             "stderr": subprocess.STDOUT, "env": env}
    try:
        cluster.procs.append(subprocess.Popen(
            ["munged", "--foreground", "--force", f"--key-file={key}", f"--socket={sock}",
             f"--pid-file={munge}/munged.pid", f"--log-file={root}/munged.log",
             f"--seed-file={munge}/munged.seed"], **quiet))
        _wait("munged's socket", sock.exists, cluster)
        cluster.procs.append(subprocess.Popen(["slurmctld", "-D", "-i", "-f", str(conf)],
                                              **quiet))
        cluster.procs.append(subprocess.Popen(["slurmd", "-D", "-N", "localhost", "-f",
                                               str(conf)], **quiet))

        def idle() -> bool:
            found = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %t"], env=env,
                                   capture_output=True, text=True)
            return found.returncode == 0 and "localhost idle" in found.stdout

        _wait("the node to be idle in sinfo", idle, cluster)
    except BaseException:
        cluster.stop()
        raise
    return cluster
