"""What each unit of an ablation asks of a cluster: the plan's ``[cluster]`` table, ``--set
cluster.KEY=VALUE`` and the command line's flags (``--partition``, ``--time``, ...), checked
before anything is submitted.

A plan::

    [cluster]                 # read by --executor slurm (and local: time, max_parallel)
    partition = "gpu"         # default: the cluster's default partition
    time = 120                # minutes per unit (one row x seed)
    gpus_per_task = 1
    cpus_per_task = 8
    mem_gb = 32
    max_parallel = 16         # array tasks running at once (default: no limit)

The resources are not part of the plan's identity: they are left out of ``OUT/plan.json`` and
its report, so a rerun may ask for more time without starting a different ablation.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from folnet.errors import FolnetError

__all__ = ["CLUSTER_KEYS", "EXECUTORS", "ClusterResources", "parse_cluster"]

#: How ``folnet ablate`` runs its units: processes on this machine (``--jobs N``, the default),
#: submitit's LocalExecutor, or one SLURM job array.
EXECUTORS = ("processes", "local", "slurm")

#: [cluster] key -> (its command-line flag, the smallest value, the largest value); partition
#: is a name, the others numbers.
LIMITS: dict[str, tuple[str, float, float]] = {
    "time": ("--time", 1, 525_600),  # minutes: up to a year
    "gpus_per_task": ("--gpus-per-task", 0, 64),
    "cpus_per_task": ("--cpus-per-task", 1, 1024),
    "mem_gb": ("--mem-gb", 1, 65_536),
    "max_parallel": ("--max-parallel", 1, 100_000),
}
CLUSTER_KEYS = ("partition", *LIMITS)


@dataclass(frozen=True)
class ClusterResources:
    """Per-unit resources of ``--executor slurm`` (and local): None leaves it to the cluster."""

    partition: str | None = None
    time: int = 60
    gpus_per_task: int = 0
    cpus_per_task: int = 1
    mem_gb: int | None = None
    max_parallel: int | None = None

    def slurm_parameters(self) -> dict[str, Any]:
        """The parameters of submitit's SlurmExecutor (``update_parameters``) they make."""
        params: dict[str, Any] = {"time": self.time, "cpus_per_task": self.cpus_per_task,
                                  "ntasks_per_node": 1, "nodes": 1}
        if self.partition is not None:
            params["partition"] = self.partition
        if self.gpus_per_task:
            params["gpus_per_task"] = self.gpus_per_task
        if self.mem_gb is not None:
            params["mem"] = f"{self.mem_gb}GB"
        if self.max_parallel is not None:
            params["array_parallelism"] = self.max_parallel
        return params


def _checked(key: str, value: Any, where: str) -> Any:
    """``value`` of [cluster] ``key``, or a `FolnetError` naming the key, its flag, the value
    and the limits."""
    if key == "partition":
        if not isinstance(value, str) or not value or any(c.isspace() for c in value):
            raise FolnetError(f"{where}: cluster partition (--partition) must be a partition "
                              f"name without spaces, got {value!r}")
        return value
    flag, low, high = LIMITS[key]
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        unit = " minutes" if key == "time" else ""
        raise FolnetError(f"{where}: cluster {key} ({flag}) must be an integer from {low} to "
                          f"{high}{unit}, got {value!r}")
    return value


def parse_cluster(raw: Any, overrides: Mapping[str, Any] | None = None, *,
                  where: str = "plan") -> ClusterResources:
    """The plan's [cluster] table ``raw`` (``--set cluster.KEY`` already in it), then the
    command line's ``overrides`` (None: not given), checked key by key."""
    if raw is None:
        raw = {}
    if not isinstance(raw, Mapping):
        raise FolnetError(f"{where}: [cluster] must be a table, got {raw!r}")
    unknown = sorted(set(raw) - set(CLUSTER_KEYS))
    if unknown:
        raise FolnetError(f"{where}: [cluster] has unknown key(s) {unknown}; allowed: "
                          f"{list(CLUSTER_KEYS)}")
    merged = {**dict(raw), **{k: v for k, v in dict(overrides or {}).items() if v is not None}}
    return ClusterResources(**{k: _checked(k, v, where) for k, v in merged.items()})
