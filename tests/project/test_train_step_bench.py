"""benchmarks/train_step.py end to end on a tiny configuration: every row it reports is a real
measurement (positive time and FLOPs, fractions of the peaks it measured), ours and the
baseline count the same step, and bf16 rows carry their fraction of the bf16 peak."""

from __future__ import annotations

import json
import math
import statistics
import sys

import pytest
from paths import BENCHMARKS

sys.path.insert(0, str(BENCHMARKS))
import train_step


@pytest.mark.slow
def test_tiny_run_reports_every_case(tmp_path, capsys):
    out = tmp_path / "ts.json"
    rc = train_step.main(["--preset", "tiny", "--vocab-size", "300", "--seq-len", "16",
                          "--batch", "2", "--ops", "j.a", "--dtypes", "float32,bf16",
                          "--impls", "ours,baseline", "--repeats", "1", "--warmup", "1",
                          "--peak-size", "256", "--json", str(out)])
    assert rc == 0
    data = json.loads(out.read_text())
    rows = data["rows"]
    assert [(r["impl"], r["dtype"]) for r in rows] == [
        ("ours", "float32"), ("ours", "bf16"), ("baseline", "float32"), ("baseline", "bf16")]
    assert data["matmul_peak_gflops"] > 0 and data["bf16_matmul_peak_gflops"] > 0
    for r in rows:
        assert r["step_s"] > 0 and r["gflop"] > 0 and r["tokens_per_s"] == pytest.approx(
            32 / r["step_s"])
        assert r["peak_frac"] == pytest.approx(r["gflops"] / data["matmul_peak_gflops"])
        assert all(math.isfinite(x) and x > 0 for x in r["first_losses"])
        # each step against the peak measured around it: recomputed from the recorded pairs
        # (comparing with step_s, a separate measurement, would be at the mercy of the load)
        pairs = r["paired_runs"]
        assert len(pairs) >= 1 and all(s > 0 and p > 0 for s, p in pairs)
        assert 0 < r["paired_peak_gflops"] and 0 < r["paired_peak_frac"] < 1
        assert r["paired_peak_gflops"] == statistics.median(p for _, p in pairs)
        assert r["paired_peak_frac"] == pytest.approx(
            statistics.median(r["gflop"] / s / p for s, p in pairs), rel=1e-9)
        if r["dtype"] == "bf16":
            assert r["bf16_peak_frac"] == pytest.approx(
                r["gflops"] / data["bf16_matmul_peak_gflops"])
        else:
            assert math.isnan(r["bf16_peak_frac"])
    # the baseline computes every operator and projection: more FLOPs for the same step
    ours, base = rows[0], rows[2]
    assert base["gflop"] > ours["gflop"]
    assert "| ours | j.a | float32 |" in capsys.readouterr().out


def test_bad_peak_size_is_refused():
    with pytest.raises(SystemExit):
        train_step.main(["--peak-size", "0", "--json", "/dev/null"])


@pytest.mark.parametrize("script", ["ab_pretrain_loop.py", "ab_step.py", "train_step.py"])
def test_a_missing_against_checkout_is_one_line(script, tmp_path):
    """Before: ab_pretrain_loop.py ended in a FileNotFoundError traceback from its subprocess."""
    import subprocess

    missing = tmp_path / "no-such-checkout"
    done = subprocess.run([sys.executable, str(BENCHMARKS / script), "--against", str(missing)],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr == (f"{script}: error: --against {str(missing)!r} holds no folnet "
                           f"package (make one with: git worktree add {missing} HEAD)\n")
