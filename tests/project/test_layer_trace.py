"""benchmarks/layer_trace.py: what one layer's forward visits, held where the layer's
per-call decisions moved to its build (22 files and 278 crossings on the CUDA path
before; counts depend on the code only)."""

from __future__ import annotations

import sys

from paths import BENCHMARKS

sys.path.insert(0, str(BENCHMARKS))
import layer_trace as lt

from folnet.ops.primitives.device import emulate


def test_a_layer_forward_crosses_files_less_than_before():
    with emulate("cuda"):
        layer, call = lt.layer_call("tiny", "jmc.atp", 16, 2)
        layer(*call)
        got = lt.trace(layer, *call)
    files = got["by_file"]
    # the stage's own files are seen, and what the tracer counts adds up
    assert {"arch/layer/dual_stream.py", "arch/layer/mixer.py", "ops/compiler.py"} <= set(files)
    assert got["calls"] == sum(files.values()) and got["files"] == len(files)
    assert got["files"] <= 21 and got["crossings"] <= 190, got
