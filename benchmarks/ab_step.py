"""A/B of one training step between this tree and another checkout, in one process.

    git worktree add /tmp/before <commit>
    python benchmarks/ab_step.py --against /tmp/before --ops jmc.atp --dtypes float32,bf16

Both folnet packages are imported into this process (the other one first, every submodule
eagerly, then set aside under its own module objects), each builds the same model from the same
seed, and the steps alternate -- before, ours, ours, before, ... -- so that a change of load on
a shared machine falls on both sides alike. The report gives each side's median step and the
median of the per-pair ratios (before / ours: above 1 means ours is faster). Peak memory is not
measured here (one process holds both); train_step.py --against measures it per process.
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import add_model_args, machine, other_checkout, table, timed, write_json
from train_step import training_step


def _folnet_modules() -> dict:
    return {k: m for k, m in sys.modules.items() if k == "folnet" or k.startswith("folnet.")}


def load_other(path: Path):
    """The folnet package of another checkout, imported whole and kept apart from ours."""
    ours = _folnet_modules()
    for name in ours:
        del sys.modules[name]
    sys.path.insert(0, str(path))
    try:
        other = importlib.import_module("folnet")
        for info in pkgutil.walk_packages(other.__path__, "folnet."):
            if not info.name.endswith("__main__"):  # eagerly: no lazy import may reach ours
                importlib.import_module(info.name)
    finally:
        sys.path.remove(str(path))
    kept = _folnet_modules()
    for name in kept:
        del sys.modules[name]
    sys.modules.update(ours)
    return other


def side(pkg, ops: str, args, dtype: str):
    torch.manual_seed(0)
    model = pkg.build_model(ops, preset=args.preset, head="pretraining",
                            vocab_size=args.vocab_size).train()
    model.gather_mlm = True  # as pretraining runs it
    model.relations = False
    return training_step(model, args, dtype)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_model_args(ap, ops="jmc.atp")
    ap.add_argument("--against", required=True, help="a checkout holding the other folnet")
    ap.add_argument("--dtypes", default="float32")
    ap.add_argument("--pairs", type=int, default=10, help="timed pairs of steps per case")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--json", default="results/ab_step.json")
    args = ap.parse_args(argv)
    args.device = "cpu"
    before_dir = other_checkout(args.against, "ab_step.py")
    if args.pairs < 1:
        ap.error(f"--pairs must be >= 1, got {args.pairs}")
    before = load_other(before_dir)
    import folnet as ours
    from folnet.runtime import tune_cpu_allocator

    tune_cpu_allocator()
    print(f"ours {Path(ours.__file__).parent}, before {Path(before.__file__).parent}",
          flush=True)
    rows = []
    for ops in args.ops.split(","):
        for dtype in args.dtypes.split(","):
            steps = {"before": side(before, ops, args, dtype),
                     "ours": side(ours, ops, args, dtype)}
            first = {}
            for name, fn in steps.items():
                torch.manual_seed(1)  # the same dropout masks for both first steps
                losses = [fn() for _ in range(max(args.warmup, 1))]
                first[name] = losses[0]
            print(f"  {ops} {dtype}: first losses {first}", flush=True)
            times: dict[str, list[float]] = {"before": [], "ours": []}
            for i in range(args.pairs):
                for name in (("before", "ours") if i % 2 == 0 else ("ours", "before")):
                    times[name].append(timed(steps[name]))
            ratios = [b / o for b, o in zip(times["before"], times["ours"], strict=True)]
            for name in ("ours", "before"):
                rows.append({"side": name, "ops": ops, "dtype": dtype,
                             "step_s": statistics.median(times[name]), "steps": times[name],
                             "before_over_ours": statistics.median(ratios),
                             "first_loss": first[name]})
            print(f"  {ops} {dtype}: ours {statistics.median(times['ours']):.3f} s, before "
                  f"{statistics.median(times['before']):.3f} s, before/ours "
                  f"{statistics.median(ratios):.3f} (pairs {len(ratios)})", flush=True)
    print()
    print(f"batch {args.batch}, T {args.seq_len}, preset {args.preset}; steps alternating in "
          f"one process, {args.pairs} pairs after {args.warmup} warm-up steps each")
    print(table(rows, [("side", "side", ""), ("ops", "ops", ""), ("dtype", "dtype", ""),
                       ("step_s", "median step s", ".3f"),
                       ("before_over_ours", "before / ours (median of pairs)", ".3f")]))
    write_json(args.json, {"machine": machine(), "args": vars(args), "rows": rows})
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
