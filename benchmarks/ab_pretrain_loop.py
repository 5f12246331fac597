"""A/B of the whole pretraining loop (data, step, guard, logging, checkpoints) against another
checkout, alternating short `folnet pretrain` runs in subprocesses.

    git worktree add /tmp/before <commit>
    python benchmarks/ab_pretrain_loop.py --against /tmp/before --pairs 3
    # the main job's pretraining (tiny, symbolic kinship, T 64, batch 32, one thread):
    OMP_NUM_THREADS=1 python benchmarks/ab_pretrain_loop.py --against /tmp/before --preset tiny \
        --steps 40 -- --data kinship-symbolic --kinship-documents 2000 --vocab-size 128 \
        --seq-len 64 --batch-size 32 --model dropout=0.0 --model initializer_range=0.15 \
        --optimizer adamw

`ab_step.py` times the model's training step alone; this times what the loop adds around it
(the non-finite guard's gradient norm and host sync, the run lock, checksums at each save).
Each pair runs before, ours (then ours, before on the next pair) on the same arguments, reads
each run's log.jsonl and takes the median seconds per step after the first `--skip` steps; the
report gives the median of the per-pair ratios (before / ours: above 1 means ours is faster).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import other_checkout  # noqa: E402


def _run(tree: Path, out: Path, args: list[str]) -> list[dict]:
    env = {**os.environ, "PYTHONPATH": str(tree), "OMP_NUM_THREADS": "2"}
    subprocess.run([sys.executable, "-m", "folnet", "pretrain", *args, "--out", str(out)],
                   env=env, check=True, stdout=subprocess.DEVNULL, cwd=tree)
    records = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    steps = [r for r in records if "elapsed" in r and "step" in r]
    return steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--against", required=True, type=Path, help="the other checkout")
    parser.add_argument("--pairs", type=int, default=3, help="alternating pairs of runs")
    parser.add_argument("--steps", type=int, default=12, help="steps per run")
    parser.add_argument("--skip", type=int, default=2, help="first steps left out (warm-up)")
    parser.add_argument("--preset", default="small", help="model size preset")
    parser.add_argument("--ops", default="jmc.atp", help="operator string")
    parser.add_argument("pretrain_args", nargs=argparse.REMAINDER,
                        help="after --: more `folnet pretrain` flags, over the defaults here "
                             "(the main job's pretraining: --data kinship-symbolic --seq-len 64 "
                             "--batch-size 32 --model dropout=0.0 --optimizer adamw)")
    args = parser.parse_args()
    extra = [a for a in args.pretrain_args if a != "--"]
    run_args = ["--ops", args.ops, "--preset", args.preset, "--data", "kinship",
                "--kinship-documents", "300", "--vocab-size", "1000", "--seq-len", "128",
                "--batch-size", "8", "--steps", str(args.steps), "--log-every", "1",
                "--save-every", str(max(args.steps // 2, 1)), "--no-progress", "--seed", "1",
                *extra]
    sides = {"before": other_checkout(args.against, "ab_pretrain_loop.py"), "ours": ROOT}
    per_step: dict[str, list[float]] = {"before": [], "ours": []}
    ratios = []
    with tempfile.TemporaryDirectory() as tmp:
        for pair in range(args.pairs):
            order = ("before", "ours") if pair % 2 == 0 else ("ours", "before")
            got = {}
            for side in order:
                steps = _run(sides[side], Path(tmp) / f"{side}-{pair}", run_args)
                times = [b["elapsed"] - a["elapsed"] for a, b in itertools.pairwise(steps)]
                got[side] = statistics.median(times[args.skip:])
                per_step[side].append(got[side])
            ratios.append(got["before"] / got["ours"])
            print(f"pair {pair + 1}: before {got['before']:.3f} s/step, "
                  f"ours {got['ours']:.3f} s/step, before/ours {ratios[-1]:.3f}", flush=True)
    print(f"{args.ops} {args.preset} {' '.join(extra) or 'batch 8, T 128'}: median s/step before "
          f"{statistics.median(per_step['before']):.3f}, ours "
          f"{statistics.median(per_step['ours']):.3f}; median before/ours "
          f"{statistics.median(ratios):.3f} over {args.pairs} pairs")


if __name__ == "__main__":
    main()
