"""benchmarks/step_tensors.py on a tiny step: the table accounts for the whole peak it reports,
tensor by tensor, and finds the binary stream's B x T x T x D2 tensors in it."""

from __future__ import annotations

import json
import math
import sys

import pytest
from paths import BENCHMARKS

sys.path.insert(0, str(BENCHMARKS))
import step_tensors

pytestmark = pytest.mark.skipif(not hasattr(__import__("torch").profiler.profile,
                                            "_memory_profile"),
                                reason="this torch's profiler has no memory profile")


def test_the_table_is_the_peak_tensor_by_tensor(tmp_path, capsys):
    out = tmp_path / "tensors.json"
    rc = step_tensors.main(["--preset", "tiny", "--seq-len", "32", "--batch", "2",
                            "--vocab", "128", "--json", str(out)])
    assert rc == 0
    data = json.loads(out.read_text())
    assert data["unit_bytes"] == 2 * 32 * 32 * 16 * 4  # B T^2 D2 float32 (tiny: D2 16)
    rows = data["rows"]
    assert data["peak_bytes"] > data["unit_bytes"]
    assert sum(r["bytes"] for r in rows) == data["peak_bytes"]
    assert all(r["tensors"] >= 1 and r["bytes"] > 0 for r in rows)
    pairs = 2 * 32 * 32 * 16  # a binary-stream tensor, in any layout
    assert any(r["shape"] and math.prod(r["shape"]) == pairs for r in rows), rows
    printed = capsys.readouterr().out
    assert "the step's peak" in printed and "| category | made by | shape |" in printed
