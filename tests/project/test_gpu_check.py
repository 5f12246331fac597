"""benchmarks/gpu_check.py, the GPU machine's one command, rehearsed on the CPU: ``--dry-run``
runs every stage end to end at toy sizes -- the CUDA tests in rehearsal mode, the benchmarks,
the pretraining runs -- and its report must hold real results. It runs with ``datasets``,
``zstandard`` and ``xformers`` made unimportable (the GPU machine may lack them) and from a
working directory outside the checkout. A stage that outlives its deadline is stopped, and what
it wrote before stays in the report.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from paths import BENCHMARKS, ROOT

HIDDEN = ("datasets", "zstandard", "xformers")
SITECUSTOMIZE = f'''
import sys

HIDDEN = {set(HIDDEN)!r}


class Hide:
    """A finder's wrapper: a hidden top-level package is not found, as if not installed."""

    def __init__(self, finder):
        self.finder = finder

    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in HIDDEN:
            return None
        find = getattr(self.finder, "find_spec", None)
        return None if find is None else find(name, path, target)

    def find_distributions(self, *args, **kwargs):
        # importlib.metadata asks the finders for installed distributions: without this a
        # wrapped finder has none, and a version lookup (huggingface_hub's of httpx2) failed
        find = getattr(self.finder, "find_distributions", None)
        for dist in (() if find is None else find(*args, **kwargs)):
            if (dist.metadata["Name"] or "").lower() not in HIDDEN:
                yield dist

    def invalidate_caches(self):
        getattr(self.finder, "invalidate_caches", lambda: None)()


sys.meta_path[:] = [Hide(finder) for finder in sys.meta_path]
'''
STAGES = ("cuda_tests", "train_step", "speed", "ops", "generate", "pretrain")


def _positive(value: object) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value) and value > 0


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory) -> tuple[dict, str, Path]:
    root = tmp_path_factory.mktemp("gpu-check")
    (root / "hide").mkdir()
    (root / "hide" / "sitecustomize.py").write_text(SITECUSTOMIZE)
    env = {**os.environ, "PYTHONPATH": str(root / "hide"), "OMP_NUM_THREADS": "1"}
    env.pop("FOLNET_GPU_REHEARSAL", None)  # the check sets it for its own tests
    start = time.time()
    done = subprocess.run([sys.executable, str(BENCHMARKS / "gpu_check.py"), "--out",
                           str(root / "out"), "--dry-run"], cwd=root, env=env,
                          capture_output=True, text=True, timeout=300)
    print(f"dry run: {time.time() - start:.1f} s")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads((root / "out" / "report.json").read_text())
    return report, (root / "out" / "report.md").read_text(), root / "out"


# the dry run (module fixture): 28-30 s on 2 idle cores, up to 57 s beside another test run
@pytest.mark.long(seconds=60)
def test_dry_run_reports_every_stage(dry_run):
    report, markdown, out = dry_run
    assert sorted(p.name for p in out.iterdir()) == ["report.json", "report.md"]
    assert report["finished"] and report["args"]["dry_run"]
    assert all(report["machine"][name] is None for name in ("datasets", "xformers"))
    assert list(report["stages"]) == list(STAGES)
    for name, stage in report["stages"].items():
        assert stage["status"] == "done", (name, stage.get("error"))
        assert _positive(stage["seconds"]) and "error" not in stage
        assert stage["title"] in markdown
    assert markdown.startswith("# folnet GPU check (finished)")


@pytest.mark.long(seconds=60)
def test_dry_run_ran_the_cuda_tests_in_rehearsal_mode(dry_run):
    stage = dry_run[0]["stages"]["cuda_tests"]
    tests = stage["tests"]
    counts = stage["summary"]
    assert counts.get("failed", 0) == 0 and counts.get("error", 0) == 0, counts
    assert counts["passed"] >= 100 and len(tests) == sum(counts.values())
    names = {t["test"].split("::")[1].split("[")[0] for t in tests if t["outcome"] == "passed"}
    for kind in ("backend_matches_the_float64_reference", "blocked_rows_equal_the_whole_square",
                 "bf16_autocast", "cached_generation", "ddp_step", "compiled_encoder",
                 "checkpointed_training_equals_the_stored_masks"):
        assert any(kind in n for n in names), kind
    assert all(t["message"] for t in tests if t["outcome"] == "skipped")
    assert any("xformers is not installed" in t["message"] for t in tests)
    props = {k: v for t in tests for k, v in t["properties"].items()}
    assert props == {"ddp_backend": "gloo", "compile_backend": "aot_eager"}
    shares = stage["tolerances"]
    assert len(shares) > 100 and all(0 <= s["share"] <= 1 for s in shares)
    assert stage["running"] is None


@pytest.mark.long(seconds=60)
def test_dry_run_benchmarks_are_measurements(dry_run):
    stages = dry_run[0]["stages"]
    train = stages["train_step"]
    assert all(_positive(v) for v in train["peaks"].values())
    assert [r["dtype"] for r in train["rows"]] == ["bf16", "float32"]
    for r in train["rows"]:
        for key in ("step_s", "tokens_per_s", "gflop", "model_gflop", "mfu", "mfu_info",
                    "peak_gib", "fit_gib", "info_gib"):
            assert _positive(r[key]), (key, r)
        assert r["tokens_per_s"] == pytest.approx(r["B"] * r["T"] / r["step_s"])
        peak = train["peaks"]["bf16_gflops"]
        assert r["mfu"] == pytest.approx(r["gflop"] / r["step_s"] / peak)
        assert r["mfu_info"] == pytest.approx(r["model_gflop"] / r["step_s"] / peak)
    ops = stages["ops"]
    assert {(r["op"], r["backend"]) for r in ops["rows"]} >= {(s, "einsum") for s in "bcjmapt"}
    assert {r["op"] for r in ops["rows"] if r["backend"] == "sdpa"} == set("cjmt")
    for r in ops["rows"] + ops["layers"]:
        assert _positive(r["ms"]) and _positive(r["gflop"]) and r["peak_mb"] >= 0
    assert [r["impl"] for r in ops["layers"]] == ["folnet auto", "folnet full", "baseline"]
    assert any(s.startswith("a/sdpa: the operator has no attention shape") for s in
               ops["not_run"])
    (gen,) = stages["generate"]["rows"]
    assert _positive(gen["cached_ms"]) and _positive(gen["recomputed_ms"])
    assert gen["speedup"] == pytest.approx(gen["recomputed_ms"] / gen["cached_ms"])


@pytest.mark.long(seconds=60)
def test_dry_run_counts_compiles_and_finds_the_largest_batch(dry_run):
    """The speed stage: the census beside BERT (no sync), the step eager and compiled beside
    BERT's (tokens/s and MFU from the same FLOPs), the batch doubled until it stops fitting
    (the dry run's ceiling: 4)."""
    stage = dry_run[0]["stages"]["speed"]
    assert _positive(stage["bf16_peak_gflops"])
    (census,) = stage["census"]
    for model in ("folnet", "bert"):
        assert census[model]["launches"] > 50 and census[model]["syncs"] == 0
    assert census["launch_ratio"] == pytest.approx(census["folnet"]["launches"]
                                                   / census["bert"]["launches"])
    rows = {(r["model"], r["mode"]): r for r in stage["steps"]}
    assert set(rows) == {(m, mode) for m in ("folnet", "bert") for mode in ("eager", "default")}
    for (model, _), r in rows.items():
        assert _positive(r["step_ms"]) and _positive(r["first_step_s"]), r
        assert r["tokens_per_s"] == pytest.approx(r["B"] * r["T"] / (r["step_ms"] / 1e3))
        assert r["gflop"] == rows[model, "eager"]["gflop"] and _positive(r["mfu"])
    assert "reduce-overhead (CUDA graphs): CUDA only" in stage["not_run"]
    assert [r["B"] for r in stage["largest"]] == [2, 4] and stage["largest_batch"] == 4
    assert all(_positive(r["fit_gib"]) for r in stage["largest"])


@pytest.mark.long(seconds=60)
def test_dry_run_pretrains_in_both_precisions(dry_run):
    stage = dry_run[0]["stages"]["pretrain"]
    runs = {r["precision"]: r for r in stage["runs"]}
    assert set(runs) == {"fp32", "bf16"}
    for r in runs.values():
        assert r["steps"] == 3 and len(r["losses"]) == 3 and _positive(r["tokens_per_s"])
        assert all(_positive(x) and x < 20 for x in r["losses"])  # ~ln(1000) + ln(2) at start
    cmp = stage["comparison"]
    assert 0 < cmp["max_rel_diff"] <= cmp["bound"] == 0.02 and cmp["within_bound"]
    fp32, bf16 = runs["fp32"]["losses"], runs["bf16"]["losses"]
    worst = max(abs(b - f) / f for f, b in zip(fp32, bf16, strict=True))
    assert cmp["max_rel_diff"] == pytest.approx(worst)


def test_a_stage_past_its_deadline_is_stopped_and_keeps_its_results(tmp_path, monkeypatch):
    sys.path.insert(0, str(BENCHMARKS))
    import gpu_check

    monkeypatch.setattr(gpu_check, "GRACE_S", 0.5)
    args = gpu_check.argparse.Namespace(budget_s=3.0, dry_run=True, stages=["ops"])
    report = gpu_check.Report(tmp_path, {"gpu": None}, {"budget_s": 3.0, "dry_run": True})
    check = gpu_check.Check(args, report)
    event = json.dumps({"op": "append", "key": "rows", "value": {"x": 1}})
    script = ("import os, time\n"  # one result, then a stage that never ends
              "with open(os.environ['FOLNET_GPU_CHECK_ROWS'], 'a') as f:\n"
              f"    f.write({event!r} + '\\n')\n"
              "time.sleep(60)\n")
    monkeypatch.setattr(check, "command", lambda name, rows, deadline: (
        [sys.executable, "-c", script], {**os.environ, "FOLNET_GPU_CHECK_ROWS": str(rows)}))
    start = time.time()
    check.run_stage("ops")
    assert time.time() - start < 10
    stage = json.loads((tmp_path / "report.json").read_text())["stages"]["ops"]
    assert stage["status"].startswith("stopped at its deadline") and stage["rows"] == [{"x": 1}]
    assert "stopped at its deadline" in (tmp_path / "report.md").read_text()
    check.deadline = time.time()  # nothing left: the next stage is not started
    check.run_stage("ops")
    check.close()
    assert report.stage("ops")["status"] == "skipped: out of time"


def test_a_stage_that_fails_leaves_its_output_in_the_report(tmp_path, monkeypatch):
    sys.path.insert(0, str(BENCHMARKS))
    import gpu_check

    args = gpu_check.argparse.Namespace(budget_s=60.0, dry_run=True, stages=["generate"])
    report = gpu_check.Report(tmp_path, {"gpu": None}, {"budget_s": 60.0, "dry_run": True})
    check = gpu_check.Check(args, report)
    monkeypatch.setattr(check, "command", lambda name, rows, deadline: (
        [sys.executable, "-c", "print('boom: the kernel said no'); raise SystemExit(3)"],
        dict(os.environ)))
    check.run_stage("generate")
    check.close()
    stage = json.loads((tmp_path / "report.json").read_text())["stages"]["generate"]
    assert stage["status"] == "failed: exit status 3"
    assert "boom: the kernel said no" in stage["error"]


def test_without_cuda_and_without_dry_run_nothing_runs(tmp_path):
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    done = subprocess.run([sys.executable, str(BENCHMARKS / "gpu_check.py"), "--out",
                           str(tmp_path / "out")], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 2 and "use --dry-run" in done.stderr
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["finished"] and "torch sees no CUDA device" in report["notes"][0]
    assert all(s["status"] == "pending" for s in report["stages"].values())


def test_the_hidden_packages_are_gone_and_every_other_distribution_stays(tmp_path):
    """The dry run's hiding finder hides the GPU machine's missing packages only: their modules
    and metadata are gone, every other distribution's metadata is found (importlib.metadata
    asks the finders; before they forwarded nothing, and transformers' import of
    huggingface_hub printed "No package metadata was found for httpx2")."""
    (tmp_path / "sitecustomize.py").write_text(SITECUSTOMIZE)
    probe = ("import importlib.metadata as m, importlib.util as u\n"
             f"for name in {HIDDEN!r}:\n"
             "    assert u.find_spec(name) is None, name\n"
             "    try:\n"
             "        m.version(name)\n"
             "    except m.PackageNotFoundError:\n"
             "        pass\n"
             "    else:\n"
             "        raise AssertionError(name + ' metadata still found')\n"
             "print(m.version('torch'), m.version('httpx2'))\n"
             "import folnet.hf\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    done = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split()[0].startswith("2."), done.stdout
    assert "Error importing" not in done.stdout + done.stderr
