"""`folnet ablate --executor`: the cluster resources (plan [cluster] keys, --set cluster.KEY,
the flags) are checked before anything is written, each error naming the key, its flag, the
value and the limit; they are not part of the plan's identity; a missing submitit is one line."""

from __future__ import annotations

import json
import sys

import pytest
from runs import cli_error, tiny_plan

from folnet.errors import FolnetError
from folnet.train.ablate.cluster import ClusterResources, parse_cluster
from folnet.train.ablate.plan import load_plan, parse_plan_dict, plan_to_dict
from folnet.train.ablate.submit import load_submitit

PLAN = tiny_plan("opts", '\n[[rows]]\nops = "j.a"\n')
BASE = {"name": "t", "data": "kinship", "tasks": ["kinship"],
        "pretrain": {"preset": "tiny", "steps": 2}, "rows": [{"ops": "j.a"}]}


@pytest.mark.parametrize(("raw", "match"), [
    ({"time": 0}, r"cluster time \(--time\) must be an integer from 1 to 525600 minutes, got 0"),
    ({"time": 10.5}, r"cluster time \(--time\) .* got 10.5"),
    ({"gpus_per_task": -1}, r"gpus_per_task \(--gpus-per-task\) .* from 0 to 64, got -1"),
    ({"cpus_per_task": 0}, r"cpus_per_task \(--cpus-per-task\) .* from 1 to 1024, got 0"),
    ({"mem_gb": True}, r"mem_gb \(--mem-gb\) .* got True"),
    ({"max_parallel": 0}, r"max_parallel \(--max-parallel\) .* from 1 to 100000, got 0"),
    ({"partition": "a b"}, r"partition \(--partition\) must be a partition name .* 'a b'"),
    ({"nodes": 2}, r"unknown key\(s\) \['nodes'\]; allowed: \['partition', 'time'"),
])
def test_bad_resources_are_named_with_value_and_limit(raw, match):
    with pytest.raises(FolnetError, match=match):
        parse_plan_dict({**BASE, "cluster": raw}, source="t.toml")


def test_resources_from_the_plan_then_the_flags():
    res = parse_cluster({"time": 30, "partition": "gpu", "mem_gb": 8},
                        {"time": 90, "cpus_per_task": None})
    assert res == ClusterResources(partition="gpu", time=90, mem_gb=8)
    assert res.slurm_parameters() == {"time": 90, "cpus_per_task": 1, "ntasks_per_node": 1,
                                      "nodes": 1, "partition": "gpu", "mem": "8GB"}
    full = ClusterResources(gpus_per_task=2, max_parallel=3).slurm_parameters()
    assert full["gpus_per_task"] == 2 and full["array_parallelism"] == 3


def test_cluster_settings_are_not_the_plan(tmp_path):
    path = tmp_path / "plan.toml"
    path.write_text(PLAN)
    plan = load_plan(path, settings=["seeds=2", "cluster.time=15", "cluster.partition=debug"])
    assert plan.cluster == ClusterResources(partition="debug", time=15)
    assert plan.settings == ("seeds=2",)  # the report names only what changes the results
    record = plan_to_dict(plan)
    assert "cluster" not in record and record["set"] == ["seeds=2"]
    assert plan == load_plan(path, settings=["seeds=2", "cluster.time=99"])  # same ablation
    with pytest.raises(FolnetError, match=r"cluster time \(--time\) .* got 0"):
        load_plan(path, settings=["cluster.time=0"])
    with pytest.raises(FolnetError, match=r"unknown key\(s\) \['gpus'\]"):
        load_plan(path, settings=["cluster.gpus=1"])


def test_cli_refuses_bad_values_before_writing(tmp_path, capsys):
    path = tmp_path / "plan.toml"
    path.write_text(PLAN)
    out = tmp_path / "out"
    base = ["ablate", str(path), "--out", str(out)]
    err = cli_error(capsys, [*base, "--executor", "slurm", "--time", "0"], "ablate")
    assert "cluster time (--time) must be an integer from 1 to 525600 minutes, got 0" in err
    err = cli_error(capsys, [*base, "--executor", "local", "--max-parallel", "-2"], "ablate")
    assert "max_parallel (--max-parallel)" in err and "got -2" in err
    err = cli_error(capsys, [*base, "--partition", "gpu", "--gpus-per-task", "1"], "ablate")
    assert "--partition, --gpus-per-task set(s) cluster resources" in err
    assert "--executor processes does not use" in err
    err = cli_error(capsys, [*base, "--executor", "slurm", "--jobs", "2"], "ablate")
    assert "--jobs 2 runs seeds as processes" in err and "--max-parallel" in err
    err = cli_error(capsys, [*base, "--executor", "slurm", "--set", "cluster.mem_gb=0"],
                    "ablate")
    assert "mem_gb (--mem-gb) must be an integer from 1 to 65536, got 0" in err
    assert not out.exists()  # refused before anything is written
    with pytest.raises(SystemExit) as exc:  # argparse: the choices named
        from folnet.cli import main
        main([*base, "--executor", "kubernetes"])
    assert exc.value.code == 2
    assert "invalid choice: 'kubernetes'" in capsys.readouterr().err


def test_missing_submitit_is_one_clear_line(monkeypatch):
    monkeypatch.setitem(sys.modules, "submitit", None)  # import submitit -> ImportError
    with pytest.raises(FolnetError, match=r"need submitit \(>= 1.5\): pip install "
                                          r"'folnet\[cluster\]'"):
        load_submitit()


def test_plan_json_of_a_run_has_no_resources(tmp_path):
    data = {**BASE, "cluster": {"time": 5}}
    plan = parse_plan_dict(data, source="t.toml")
    assert plan.cluster.time == 5
    assert json.loads(json.dumps(plan_to_dict(plan))).get("cluster") is None
