"""What one layer's forward visits: the folnet files its Python calls enter, and how often a
call crosses from one file into another (a reader follows each crossing).

    python benchmarks/layer_trace.py                  # tiny jmc.atp encoder layer, both paths
    python benchmarks/layer_trace.py --json F

Traced with ``sys.setprofile`` over one call of a built layer (after one untraced call, so
that caches are made): every Python call and return whose code lies in the folnet package is
seen; a crossing is a call whose caller's file differs from the callee's. Counts depend on the
code only, not on the machine.
"""

from __future__ import annotations

import argparse
import collections
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import write_json

import folnet
from folnet.arch.layer.domain import Domain
from folnet.ops.primitives.device import emulate

PACKAGE = str(Path(folnet.__file__).resolve().parent)


def trace(layer: torch.nn.Module, *args, **kwargs) -> dict:
    """Files entered and crossings of one ``layer(*args, **kwargs)``."""
    files: collections.Counter = collections.Counter()
    crossings = 0

    def profile(frame, event, arg) -> None:
        nonlocal crossings
        if event != "call":
            return
        here = frame.f_code.co_filename
        if not here.startswith(PACKAGE):
            return
        files[here] += 1
        caller = frame.f_back
        while caller is not None and not caller.f_code.co_filename.startswith(PACKAGE):
            caller = caller.f_back  # through torch's own frames (a module's __call__)
        if caller is not None and caller.f_code.co_filename != here:
            crossings += 1

    sys.setprofile(profile)
    try:
        layer(*args, **kwargs)
    finally:
        sys.setprofile(None)
    return {"files": len(files), "crossings": crossings, "calls": sum(files.values()),
            "by_file": {str(Path(f).relative_to(PACKAGE)): n for f, n in files.most_common()}}


def layer_call(preset: str, ops: str, seq_len: int, batch: int) -> tuple:
    torch.manual_seed(0)
    model = folnet.build_model(ops, preset=preset)
    model.train()
    layer = model.encoder.layers[0]
    cfg = layer.cfg
    u1 = torch.randn(batch, seq_len, cfg.D1)
    u2 = torch.randn(batch, seq_len, seq_len, cfg.D2)
    return layer, (u1, u2, Domain(n=seq_len))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--ops", default="jmc.atp")
    parser.add_argument("--seq-len", type=int, default=16)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    rows = []
    for path in ("cpu", "cuda"):
        with emulate(path):
            layer, call = layer_call(args.preset, args.ops, args.seq_len, 2)
            layer(*call)
            got = trace(layer, *call)
        rows.append({"path": path, **got})
        print(f"{path:>4}: {got['files']} files, {got['crossings']} crossings, "
              f"{got['calls']} calls")
    if args.json is not None:
        write_json(args.json, {"args": vars(args) | {"json": str(args.json)}, "rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
