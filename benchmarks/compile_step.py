"""Eager against compiled: folnet's pretraining step (`folnet.train.pretrain.loop.train_step`,
as ``folnet pretrain`` runs it) with and without ``--compile``, in one process.

    python benchmarks/compile_step.py                        # tiny and small, T 64, batch 8
    python benchmarks/compile_step.py --presets small --rounds 7 --json out.json

Two models of the same weights, one eager, one with its forward, losses and metrics compiled
as one graph (inductor, ``fullgraph=True``; backward through AOT autograd). The compiled
model's first step is timed alone, once and twice more (the compile, then the first replay;
a recompile would show there); then the two take steps in turns, ``--rounds`` rounds of
``--steps`` steps, the order swapped each round, and the table gives each side's median step
and the median of the per-round ratios (the machine's load drifts; a ratio within one round
does not).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import machine, write_json
from steps import folnet_step

from folnet.runtime import tune_cpu_allocator


def _timed(run, steps: int) -> float:
    start = time.perf_counter()
    for _ in range(steps):
        run()
    return (time.perf_counter() - start) / steps


def measure(preset: str, *, batch: int, seq_len: int, rounds: int, steps: int,
            optimizer: str) -> dict:
    kw = {"batch": batch, "seq_len": seq_len, "optimizer": optimizer, "path": "cpu"}
    eager = folnet_step(preset, **kw)
    compiled = folnet_step(preset, compile_mode="default", **kw)
    eager.run()  # warm: lazy state, first-call costs
    first = time.perf_counter()
    compiled.run()
    compile_s = time.perf_counter() - first
    second = _timed(compiled.run, 1)
    times: dict[str, list[float]] = {"eager": [], "compiled": []}
    ratios = []
    for r in range(rounds):
        order = ("eager", "compiled") if r % 2 == 0 else ("compiled", "eager")
        got = {name: _timed((eager if name == "eager" else compiled).run, steps)
               for name in order}
        for name, t in got.items():
            times[name].append(t)
        ratios.append(got["eager"] / got["compiled"])
    return {"preset": preset, "batch": batch, "seq_len": seq_len, "optimizer": optimizer,
            "compile_s": compile_s, "second_step_s": second,
            "eager_s": statistics.median(times["eager"]),
            "compiled_s": statistics.median(times["compiled"]),
            "speedup": statistics.median(ratios), "rounds": rounds, "steps": steps,
            "threads": torch.get_num_threads()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--presets", default="tiny,small")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--optimizer", default="lamb")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    tune_cpu_allocator(args.seq_len)
    rows = []
    for preset in args.presets.split(","):
        row = measure(preset, batch=args.batch, seq_len=args.seq_len, rounds=args.rounds,
                      steps=args.steps, optimizer=args.optimizer)
        rows.append(row)
        print(f"{preset:>5} T{row['seq_len']} B{row['batch']}: compile {row['compile_s']:.1f} s "
              f"(next step {row['second_step_s']:.3f} s); eager {row['eager_s']:.3f} s, "
              f"compiled {row['compiled_s']:.3f} s a step: {row['speedup']:.2f}x", flush=True)
    if args.json is not None:
        write_json(args.json, {"machine": machine(), "rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
